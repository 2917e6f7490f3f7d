"""``import tensortorrent as tt``: the public API of :mod:`tensortorrent_dynamo`."""

from tensortorrent_dynamo import *  # noqa: F403
from tensortorrent_dynamo import __all__, __version__  # noqa: F401
