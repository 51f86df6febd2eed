import os
import pathlib

import pytest

SOURCE_DIR = pathlib.Path(os.environ.get("DISTJAX_SOURCE_DIR",
                                         pathlib.Path(__file__).resolve().parents[2]))


@pytest.fixture
def source_dir():
    return SOURCE_DIR
