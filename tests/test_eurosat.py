"""EuroSAT RGB and MS: their specs, their archives' layouts found from every root depth (on fake trees), the
not-found message, and download_dataset on a local archive."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import shutil
import socket
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import rasterio
import torchvision.datasets.utils
from eurosat_fakes import MS_CLASS_DIR, ms_reflectance, write_eurosat_ms, write_eurosat_rgb

import rsnet.data.download
from rsnet.data import DATASETS, DatasetNotFoundError, find_class_root, scan_dataset
from rsnet.data.download import download_dataset

COUNTS = {"AnnualCrop": 3000, "Forest": 3000, "HerbaceousVegetation": 3000, "Highway": 2500, "Industrial": 2500,
          "Pasture": 2000, "PermanentCrop": 2500, "Residential": 3000, "River": 2500, "SeaLake": 3000}
WRITERS = {"eurosat_ms": write_eurosat_ms, "eurosat_rgb": write_eurosat_rgb}


def _class_root(name: str, top: Path) -> Path:
    return top.parent / MS_CLASS_DIR if name == "eurosat_ms" else top


def test_specs_match_the_archives() -> None:
    rgb, ms = DATASETS["eurosat_rgb"], DATASETS["eurosat_ms"]
    for spec in (rgb, ms):
        assert dict(spec.counts) == COUNTS and spec.classes == tuple(COUNTS)
        assert spec.num_classes == 10 and spec.num_images == 27_000
        assert spec.ground_resolution_m == 10.0 and len(spec.download_md5) == 32
    assert ms.band_names == ("B01", "B02", "B03", "B04", "B05", "B06", "B07", "B08", "B09", "B10", "B11", "B12",
                             "B8A")
    assert [ms.band_names[i - 1] for i in ms.rgb_bands] == ["B04", "B03", "B02"]
    assert rgb.band_names == () and rgb.rgb_bands == ()
    assert ms.layout == "ds/images/remote_sensing/otherDatasets/sentinel_2/tif/<class>/<class>_<n>.tif"
    assert rgb.layout == "2750/<class>/<class>_<n>.jpg"
    assert ms.download_url.endswith("/EuroSATallBands.zip") and rgb.download_url.endswith("/EuroSAT.zip")
    # the new fields leave the other datasets as they were
    assert DATASETS["ucmerced"].ground_resolution_m == 0.3 and DATASETS["aid"].ground_resolution_m is None
    assert DATASETS["aid"].download_url == "" and DATASETS["aid"].band_names == ()


def test_fake_ms_files_are_13_band_geotiffs_with_class_spectra(tmp_path: Path) -> None:
    top = write_eurosat_ms(tmp_path, per_class=1, size=8, classes=["Forest", "SeaLake"])
    assert top == tmp_path / "ds"
    for label, cls in ((1, "Forest"), (9, "SeaLake")):
        with rasterio.open(top.parent / MS_CLASS_DIR / cls / f"{cls}_1.tif") as src:
            assert (src.count, src.dtypes[0], src.crs.to_epsg(), src.res) == (13, "uint16", 32632, (10.0, 10.0))
            means = src.read().reshape(13, -1).mean(axis=1)
        assert np.allclose(means, ms_reflectance(label), atol=60)


@pytest.mark.parametrize("name", ["eurosat_ms", "eurosat_rgb"])
def test_found_from_every_root_depth(tmp_path: Path, name: str) -> None:
    top = WRITERS[name](tmp_path, per_class=2, size=8)
    class_root = _class_root(name, top)
    suffix = ".tif" if name == "eurosat_ms" else ".jpg"
    for root in (top.parent, top, class_root):
        scan = scan_dataset(name, root, check_counts=False)
        assert scan.class_root == class_root, root
        assert scan.counts() == {c: 2 for c in COUNTS}
        assert scan.names[:2] == [f"AnnualCrop/AnnualCrop_1{suffix}", f"AnnualCrop/AnnualCrop_2{suffix}"]
        assert np.array_equal(scan.labels, np.repeat(np.arange(10), 2))


def test_rgb_and_ms_side_by_side_each_find_their_own(tmp_path: Path) -> None:
    ms, rgb = write_eurosat_ms(tmp_path, per_class=1, size=8), write_eurosat_rgb(tmp_path, per_class=1, size=8)
    assert find_class_root("eurosat_ms", tmp_path) == _class_root("eurosat_ms", ms)
    assert find_class_root("eurosat_rgb", tmp_path) == rgb


@pytest.mark.parametrize("name", ["eurosat_ms", "eurosat_rgb"])
def test_a_missing_tree_names_the_layout_and_the_download(tmp_path: Path, name: str) -> None:
    (tmp_path / "photos" / "holiday").mkdir(parents=True)
    with pytest.raises(DatasetNotFoundError) as err:
        scan_dataset(name, tmp_path)
    message, spec = str(err.value), DATASETS[name]
    assert str(tmp_path) in message and spec.layout in message
    archive = "EuroSATallBands.zip" if name == "eurosat_ms" else "EuroSAT.zip"
    assert f"download: https://madm.dfki.de/files/sentinel/{archive}" in message


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A folder served over HTTP on localhost (torchvision's downloader reads http(s) responses, not file://):
    (the folder, its URL)."""
    folder = tmp_path / "served"
    folder.mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield folder, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _local_archive(monkeypatch: pytest.MonkeyPatch, served: tuple[Path, str], name: str,
                   md5: str | None = None) -> Path:
    """A zip of a fake tree of ``name`` as the spec's download (a localhost URL and the zip's md5); returns the zip."""
    folder, url = served
    source = folder.parent / "source"
    WRITERS[name](source, per_class=2, size=8)
    top = "ds" if name == "eurosat_ms" else "2750"
    archive = Path(shutil.make_archive(str(folder / "archive"), "zip", source, top))
    digest = md5 or hashlib.md5(archive.read_bytes()).hexdigest()
    spec = dataclasses.replace(DATASETS[name], download_url=f"{url}/{archive.name}", download_md5=digest)
    monkeypatch.setattr(rsnet.data.download, "get_spec", lambda _: spec)
    return archive


@pytest.mark.parametrize("name", ["eurosat_ms", "eurosat_rgb"])
def test_download_extracts_then_skips(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, served: tuple[Path, str],
                                      name: str) -> None:
    archive = _local_archive(monkeypatch, served, name)
    root = tmp_path / "data"
    assert download_dataset(name, root) == root
    assert not (root / archive.name).exists()  # unpacked, then deleted
    scan = scan_dataset(name, root, check_counts=False)
    assert len(scan.names) == 20 and root in scan.class_root.parents

    def no_download(*args, **kwargs) -> None:
        raise AssertionError("downloaded again")

    monkeypatch.setattr(torchvision.datasets.utils, "download_and_extract_archive", no_download)
    archive.unlink()
    assert download_dataset(name, root) == root
    assert download_dataset(name, scan.class_root) == scan.class_root  # a root down to the class folders too


def test_a_failed_download_is_one_line_and_leaves_no_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No network (here a port nobody listens on): one DatasetNotFoundError line that names the URL, the reason and
    the way by hand; the dataset folder the download created is gone again (a wrong checksum: the test below)."""
    with socket.socket() as closed:  # a free port, closed again: the connection is refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    url = f"http://127.0.0.1:{port}/EuroSAT.zip"
    spec = dataclasses.replace(DATASETS["eurosat_rgb"], download_url=url)
    monkeypatch.setattr(rsnet.data.download, "get_spec", lambda _: spec)
    root = tmp_path / "data"
    with pytest.raises(DatasetNotFoundError) as raised:
        download_dataset("eurosat_rgb", root)
    message = str(raised.value)
    assert message.startswith(f"dataset.download=true: cannot download {url} (") and "\n" not in message
    assert "refused" in message and message.endswith("unpack it and set dataset.root to its folder")
    assert not root.exists()


def test_download_is_not_fooled_by_the_other_eurosat(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                    served: tuple[Path, str]) -> None:
    _local_archive(monkeypatch, served, "eurosat_rgb")
    root = tmp_path / "data"
    write_eurosat_ms(root, per_class=1, size=8)  # same class names, other archive
    download_dataset("eurosat_rgb", root)
    assert find_class_root("eurosat_rgb", root) == root / "2750"


def test_a_wrong_checksum_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                     served: tuple[Path, str]) -> None:
    _local_archive(monkeypatch, served, "eurosat_rgb", md5="0" * 32)
    with pytest.raises(DatasetNotFoundError, match="corrupted"):
        download_dataset("eurosat_rgb", tmp_path / "data")
    assert not (tmp_path / "data").exists()


def test_a_dataset_without_download_says_where_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"'aid' cannot be downloaded.*https://captain-whu\.github\.io/AID/"):
        download_dataset("aid", tmp_path)
    assert not any(tmp_path.iterdir())
