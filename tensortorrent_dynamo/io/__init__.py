"""The disk tier: weights kept in safetensors files and read back around the page cache.

Lowest first (a module imports only those above it):

* :mod:`.page_cache`: the page size, and dropping a file's pages from the page cache;
* :mod:`.integrity`: block checksums, and :class:`~.integrity.FileGuard`, which holds every
  read of a file to them;
* :mod:`.safetensors`: reading a safetensors header, writing a file atomically;
* :mod:`.pool`: the page-aligned host buffers reads land in;
* :mod:`.reader`: :class:`~.reader.DiskReader`, threads reading tensors around the page cache;
* :mod:`.store`: :class:`~.store.OffloadStore`, the checksummed directory of shards.
"""
