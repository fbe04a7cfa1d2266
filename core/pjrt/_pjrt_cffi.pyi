# The cffi extension built by _build_cffi.py: its members are known only once it is built, so
# type checkers see them as Any (and need no build to check the package).
from typing import Any

ffi: Any
lib: Any
