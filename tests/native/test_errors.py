"""The native core's errors: a panic becomes an arrowlake error naming the operation (the
process lives on), and refused input raises arrowlake's errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from arrowlake import native
from arrowlake.errors import ArrowlakeError, ValidationError


def test_a_panic_is_an_arrowlake_error_naming_the_operation() -> None:
    with pytest.raises(ArrowlakeError, match="native kernel '_panic' failed.*deliberate"):
        native._call("_panic", native._lib()._panic)
    # The interpreter is intact: kernels still run.
    assert native.bucket_of([pa.array([1])], 4).to_pylist() == [
        int(native.key_hash([pa.array([1])])[0] % 4)]


def test_a_panic_does_not_abort_a_process() -> None:
    code = ("from arrowlake import native\n"
            "try:\n    native._call('_panic', native._lib()._panic)\n"
            "except Exception as e:\n    print(type(e).__name__)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ArrowlakeError"


def test_mismatched_lengths_are_refused() -> None:
    with pytest.raises(ValidationError, match="column 1 has 1 rows, column 0 has 2"):
        native.key_hash([pa.array([1, 2]), pa.array([1])])
    with pytest.raises(ValidationError, match="3 group codes for 2 rows"):
        native.sorted_groups([pa.array([1, 2])], np.array([0, 0, 1]))


def test_null_keys_are_refused_by_the_kernel_itself() -> None:
    with pytest.raises(ValidationError, match="may not be null"):
        native.group_versions([pa.array([1, None])], None, np.array([1, 2]))


def test_unsupported_key_types_are_refused() -> None:
    with pytest.raises(ValidationError, match="key type"):
        native.group_versions([pa.array([[1]])], None, np.array([1]))
    with pytest.raises(ValidationError, match="Cannot hash key values of type List"):
        native.key_hash([pa.array([[1]])])
