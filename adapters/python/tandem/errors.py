"""Exceptions: every failing library call raises TandemError carrying the status code, the
status name (tdm_strerror) and the handle's detailed message (tdm_*_errmsg)."""
from __future__ import annotations

from enum import IntEnum


class Status(IntEnum):
    OK = 0
    INVAL = -1
    NOMEM = -2
    NOT_FOUND = -3
    EXISTS = -4
    STATE = -5
    RANGE = -6
    CONFIG = -7
    NO_SPACE = -8
    AGAIN = -9
    TIMEOUT = -10
    PROTOCOL = -11
    IO = -12
    NO_CUDA = -13
    CUDA = -14
    VERSION = -15
    LAYOUT = -16
    AUTH = -17
    CANCELLED = -18
    PEER = -19
    UNSUPPORTED = -20
    INTERNAL = -21
    TRUNCATED = -22
    PLUGIN = -23


class TandemError(Exception):
    """A libtandem call failed. .status is the TDM_E_* code (int), .name its tdm_strerror()
    text, .message the library's detailed message for the handle ("" if none), .func the C
    function."""

    def __init__(self, status: int, message: str = "", func: str = ""):
        from . import _lib
        self.status = int(status)
        self.name = _lib.strerror(self.status)
        self.message = message or ""
        self.func = func
        text = f"{func}: " if func else ""
        text += self.name
        if self.message:
            text += f": {self.message}"
        try:
            text += f" [{Status(self.status).name}]"
        except ValueError:
            text += f" [{self.status}]"
        super().__init__(text)

    @property
    def code(self):
        """The status as a Status enum member when known, else the int."""
        try:
            return Status(self.status)
        except ValueError:
            return self.status
