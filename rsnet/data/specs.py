"""Dataset metadata: ``DATASETS`` maps a config name to its :class:`DatasetSpec`; an ``image_folder`` dataset gets its
spec from ``dataset.root`` (:func:`image_folder_spec`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from .errors import DatasetNotFoundError

__all__ = ["DatasetSpec", "DATASETS", "IMAGE_EXTENSIONS", "IMAGE_FOLDER", "get_spec", "image_folder_spec",
           "is_image_file"]

IMAGE_EXTENSIONS = (".tif", ".tiff", ".jpg", ".jpeg", ".png", ".bmp")


@dataclass(frozen=True)
class DatasetSpec:
    """One scene-classification archive: ``classes`` in label order, expected ``counts``, the folders above the class
    folders, and for messages ``file_pattern`` and ``url``.

    Optional: ``band_names`` of a multispectral archive in file order (empty: an ordinary RGB dataset),
    ``rgb_bands`` the 1-based indices of its RGB composite, ``download_url``/``download_md5`` an archive that
    :func:`rsnet.data.download.download_dataset` fetches (empty: no download offered), ``ground_resolution_m``
    the ground sampling distance (None: unknown or varying)."""

    name: str
    title: str
    classes: tuple[str, ...]
    counts: Mapping[str, int]
    base_dir: str
    images_subdir: str
    file_pattern: str
    url: str
    band_names: tuple[str, ...] = ()
    rgb_bands: tuple[int, ...] = ()
    download_url: str = ""
    download_md5: str | None = None
    ground_resolution_m: float | None = None

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def num_images(self) -> int:
        return sum(self.counts.values())

    @property
    def layout(self) -> str:
        """The expected folder layout, e.g. ``UCMerced_LandUse/Images/<class>/<class>NN.tif``."""
        parts = [self.base_dir, self.images_subdir, "<class>", self.file_pattern]
        return "/".join(p for p in parts if p)


def _spec(counts: dict[str, int], **kw) -> DatasetSpec:
    return DatasetSpec(classes=tuple(counts), counts=MappingProxyType(dict(counts)), **kw)


UCM_CLASSES = (
    "agricultural airplane baseballdiamond beach buildings chaparral denseresidential forest freeway "
    "golfcourse harbor intersection mediumresidential mobilehomepark overpass parkinglot river runway "
    "sparseresidential storagetanks tenniscourt"
).split()

NWPU_CLASSES = (
    "airplane airport baseball_diamond basketball_court beach bridge chaparral church circular_farmland "
    "cloud commercial_area dense_residential desert forest freeway golf_course ground_track_field harbor "
    "industrial_area intersection island lake meadow medium_residential mobile_home_park mountain overpass "
    "palace parking_lot railway railway_station rectangular_farmland river roundabout runway sea_ice ship "
    "snowberg sparse_residential stadium storage_tank tennis_court terrace thermal_power_station wetland"
).split()

AID_COUNTS = {
    "Airport": 360, "BareLand": 310, "BaseballField": 220, "Beach": 400, "Bridge": 360,
    "Center": 260, "Church": 240, "Commercial": 350, "DenseResidential": 410, "Desert": 300,
    "Farmland": 370, "Forest": 250, "Industrial": 390, "Meadow": 280, "MediumResidential": 290,
    "Mountain": 340, "Park": 350, "Parking": 390, "Playground": 370, "Pond": 420,
    "Port": 380, "RailwayStation": 260, "Resort": 290, "River": 410, "School": 300,
    "SparseResidential": 300, "Square": 330, "Stadium": 290, "StorageTanks": 360, "Viaduct": 420,
}  # fmt: skip

EUROSAT_COUNTS = {
    "AnnualCrop": 3000, "Forest": 3000, "HerbaceousVegetation": 3000, "Highway": 2500, "Industrial": 2500,
    "Pasture": 2000, "PermanentCrop": 2500, "Residential": 3000, "River": 2500, "SeaLake": 3000,
}  # fmt: skip
SENTINEL2_BANDS = ("B01", "B02", "B03", "B04", "B05", "B06", "B07", "B08", "B09", "B10", "B11", "B12", "B8A")

UCMERCED = _spec({c: 100 for c in UCM_CLASSES}, name="ucmerced", title="UC Merced Land Use",
                 base_dir="UCMerced_LandUse", images_subdir="Images", file_pattern="<class>NN.tif",
                 url="http://weegee.vision.ucmerced.edu/datasets/UCMerced_LandUse.zip "
                     "(page: http://weegee.vision.ucmerced.edu/datasets/landuse.html)",
                 ground_resolution_m=0.3)  # 1 ft USGS orthophotos
NWPU_RESISC45 = _spec({c: 700 for c in NWPU_CLASSES}, name="nwpu_resisc45", title="NWPU-RESISC45",
                      base_dir="NWPU-RESISC45", images_subdir="", file_pattern="<class>_NNN.jpg",
                      url="https://gcheng-nwpu.github.io/#Datasets "
                          "(official OneDrive/Baidu links to NWPU-RESISC45.rar)")  # resolution: 0.2-30 m, varies
AID = _spec(AID_COUNTS, name="aid", title="AID (Aerial Image Dataset)", base_dir="AID", images_subdir="",
            file_pattern="<classname>_<n>.jpg",
            url="https://captain-whu.github.io/AID/ (official OneDrive/Baidu links to AID.zip)")  # 0.5-8 m, varies
UCMERCED_MINI = _spec({c: 20 for c in UCM_CLASSES}, name="ucmerced_mini",
                      title="UC Merced Land Use (bundled mini sample)", base_dir="ucmerced-mini",
                      images_subdir="Images", file_pattern="<class>NN.jpg",
                      url="bundled with rsnet at data/ucmerced-mini (images 80-99 of every class of the UCM archive)",
                      ground_resolution_m=0.6)  # UC Merced's 1 ft orthophotos halved: 128 px covering ~77 m
# EuroSAT (Helber et al., JSTARS 2019 / IGARSS 2018; MIT, github.com/phelber/EuroSAT): Sentinel-2, 64 px at 10 m.
# The Hugging Face copies are torchgeo's unmodified mirrors of the authors' archives (same checksums), pinned to
# a revision: the URLs and md5s are torchvision's EuroSAT (RGB) and torchgeo's EuroSAT (all bands).
EUROSAT_RGB = _spec(EUROSAT_COUNTS, name="eurosat_rgb", title="EuroSAT (RGB)", base_dir="2750", images_subdir="",
                    file_pattern="<class>_<n>.jpg",
                    url="https://madm.dfki.de/files/sentinel/EuroSAT.zip (page: https://github.com/phelber/EuroSAT; "
                        "mirror: https://huggingface.co/datasets/torchgeo/eurosat)",
                    download_url="https://huggingface.co/datasets/torchgeo/eurosat/resolve/"
                                 "c877bcd43f099cd0196738f714544e355477f3fd/EuroSAT.zip",
                    download_md5="c8fa014336c82ac7804f0398fcb19387", ground_resolution_m=10.0)
EUROSAT_MS = _spec(EUROSAT_COUNTS, name="eurosat_ms", title="EuroSAT (multispectral, 13 bands)", base_dir="ds",
                   images_subdir="images/remote_sensing/otherDatasets/sentinel_2/tif", file_pattern="<class>_<n>.tif",
                   url="https://madm.dfki.de/files/sentinel/EuroSATallBands.zip (page: "
                       "https://github.com/phelber/EuroSAT; mirror: https://huggingface.co/datasets/torchgeo/eurosat)",
                   band_names=SENTINEL2_BANDS, rgb_bands=(4, 3, 2),
                   download_url="https://hf.co/datasets/torchgeo/eurosat/resolve/"
                                "1ce6f1bfb56db63fd91b6ecc466ea67f2509774c/EuroSATallBands.zip",
                   download_md5="5ac12b3b2557aa56e1826e981e8e200e", ground_resolution_m=10.0)

DATASETS: Mapping[str, DatasetSpec] = MappingProxyType({s.name: s for s in (UCMERCED, NWPU_RESISC45, AID,
                                                                              UCMERCED_MINI, EUROSAT_RGB, EUROSAT_MS)})

IMAGE_FOLDER = "image_folder"  # dataset.name of the user's own data: its spec is read from dataset.root
_IMAGE_FOLDER_LAYOUT = "a folder with one sub-folder of images per class"


def is_image_file(f: Path) -> bool:
    """An image file as the loader counts it: a known extension (any case), not hidden."""
    return f.suffix.lower() in IMAGE_EXTENSIONS and not f.name.startswith(".") and f.is_file()


def image_folder_spec(root: str | os.PathLike | None) -> DatasetSpec:
    """The spec of the user's own dataset at ``root`` (torchvision ImageFolder layout): the classes are the
    sorted sub-folders holding at least one image, the counts those found (so the count check never warns)."""
    if root is None or str(root) == "":
        raise ValueError(f"dataset.root=... is required for dataset={IMAGE_FOLDER}: {_IMAGE_FOLDER_LAYOUT}")
    path = Path(root).expanduser()
    if not path.is_dir():
        why = "is not a folder" if path.exists() else "does not exist"
        raise DatasetNotFoundError(f"dataset.root='{root}' {why} (dataset={IMAGE_FOLDER}: {_IMAGE_FOLDER_LAYOUT})")
    try:
        entries = sorted(path.iterdir(), key=lambda p: p.name)
    except OSError as error:
        raise DatasetNotFoundError(f"dataset.root='{root}' cannot be read ({error.strerror or error}; "
                                   f"dataset={IMAGE_FOLDER}: {_IMAGE_FOLDER_LAYOUT})") from error
    counts: dict[str, int] = {}
    for sub in entries:
        if sub.is_dir() and not sub.name.startswith("."):
            n = sum(1 for f in sub.iterdir() if is_image_file(f))
            if n:
                counts[sub.name] = n
    if len(counts) < 2:
        found = (f"only 1 sub-folder with images ({next(iter(counts))!r}, {sum(counts.values())} images)" if counts
                 else "no sub-folder with images")
        loose = sum(1 for f in entries if is_image_file(f))
        hint = f", and {loose} images directly in it (they are not read)" if loose else ""
        raise ValueError(f"dataset.root='{root}' holds {found}{hint}; dataset={IMAGE_FOLDER} needs "
                         f"{_IMAGE_FOLDER_LAYOUT}, at least 2 classes (extensions {', '.join(IMAGE_EXTENSIONS)})")
    return _spec(counts, name=IMAGE_FOLDER, title=f"image folder {path}", base_dir=path.resolve().name,
                 images_subdir="", file_pattern="<image file>",
                 url=f"none: dataset={IMAGE_FOLDER} is your own data ({_IMAGE_FOLDER_LAYOUT}), read from dataset.root")


def get_spec(name: str | DatasetSpec, root: str | os.PathLike | None = None) -> DatasetSpec:
    """The :class:`DatasetSpec` of a config name (``image_folder``: read from ``root``); ValueError listing valid
    names."""
    if isinstance(name, DatasetSpec):
        return name
    if name == IMAGE_FOLDER:
        return image_folder_spec(root)
    try:
        return DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown dataset.name {name!r}; valid names: {sorted([*DATASETS, IMAGE_FOLDER])}") from None
