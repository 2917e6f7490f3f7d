"""The disk tier, and files written whole: weights kept in safetensors files and read back
around the page cache.

Lowest first (a module imports only those above it):

* :mod:`.files`: the one atomic JSON/text writer and the one digest;
* :mod:`.page_cache`: the page size, and dropping a file's pages from the page cache;
* :mod:`.locations`: where a tensor's bytes are in a file (:class:`~.locations.TensorLocation`),
  block checksums, and :class:`~.locations.FileGuard`, which holds every read to them;
* :mod:`.safetensors`: reading a safetensors header, writing a file atomically;
* :mod:`.pool`: the page-aligned host buffers reads land in;
* :mod:`.reader`: :class:`~.reader.DiskReader`, threads reading tensors around the page cache;
* :mod:`.store`: :class:`~.store.OffloadStore`, the checksummed directory of shards.
"""
