"""GDAL's messages collected per thread: the reading thread's go to its list, every other thread's are logged as
before (nothing of theirs is swallowed or attributed to the reader)."""

from __future__ import annotations

import logging
import threading

import pytest

from rsnet.data.native_messages import gdal_reason, this_threads_gdal_messages


def test_a_threads_gdal_messages_are_its_own_and_the_others_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    gdal = logging.getLogger("rasterio._env")
    inside, logged = threading.Event(), threading.Event()
    collected: list[str] = []

    def reader() -> None:
        with this_threads_gdal_messages() as said:
            gdal.info("GDAL signalled an error: err_no=1, msg='libjpeg: Premature end of JPEG file'")
            inside.set()
            logged.wait()  # the other thread logs while this one still collects
            collected.extend(said)

    with caplog.at_level(logging.WARNING):
        thread = threading.Thread(target=reader)
        thread.start()
        inside.wait()
        gdal.error("another thread's GDAL error")
        gdal.info("another thread's chatter below the level")
        logged.set()
        thread.join()
    assert collected == ["GDAL signalled an error: err_no=1, msg='libjpeg: Premature end of JPEG file'"]
    assert caplog.messages == ["another thread's GDAL error"]
    assert gdal_reason(collected) == "libjpeg: Premature end of JPEG file" and gdal_reason([]) is None
    rasterio_logger = logging.getLogger("rasterio")
    assert rasterio_logger.propagate and not any(type(h).__name__ == "_PerThread" for h in rasterio_logger.handlers)
