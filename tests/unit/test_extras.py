"""A missing optional package (an extra) is one clear line with its install command and exit
code 2 (nothing was started), whichever command needs it."""

from __future__ import annotations

import pytest

from gpufleet.errors import EXIT_BAD_INPUT, UserInputError
from gpufleet.extras import install_hint, require


def test_require_names_the_missing_package_and_its_extra() -> None:
    with pytest.raises(UserInputError) as caught:
        require("cluster", "json", "gpufleet_no_such_module", what="the cluster commands")
    error = caught.value
    assert error.exit_code == EXIT_BAD_INPUT
    assert [(e.path, e.message) for e in error.errors] == [
        ("gpufleet_no_such_module", "the cluster commands needs: pip install 'gpufleet[cluster]'")
    ]
    assert [m.__name__ for m in require("serve", "json")] == ["json"]
    assert install_hint("s3") == "pip install 'gpufleet[s3]'"
