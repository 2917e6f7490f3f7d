"""The harness of the offload benches (ram_offload, hf_offload, generate).

A model whose parameters are larger than a memory budget is run by eager PyTorch with no
budget (the reference), by Accelerate with the budget and the rest offloaded, and by
TensorTorrent with the same budget. Every competitor runs each regime in a fresh Python
process of its own (``python -m bench.offload.child run SPEC OUT``), so that its peak RSS
is its own and nothing is left over from another regime.

One run of a bench, from the parent process:

1. Setup, in a subprocess: the model is built with real weights from a fixed seed, saved
   once as ``model.safetensors`` in the work directory, and each regime's inputs and
   eager's outputs are saved to ``reference.pt``. Every competitor loads its weights from
   that one file; none of them builds random weights.
2. The disk's read bandwidth is measured at the offload directory with the project's own
   ``DiskBench`` (one stream of O_DIRECT reads where the filesystem allows it; the method is
   recorded), before the competitors and again after them.
3. ``--rounds`` rounds (3 at full size, 1 with ``--quick``). Each round first reads
   ``model.safetensors`` cold with the project's own ``DiskReader`` (every tensor submitted at
   once, its default 4 threads; the bandwidth TensorTorrent's reader reaches on this very
   file), then runs every (regime, competitor) process, odd rounds in one order and even
   rounds in the reverse (``schedule``), so that the disk's and the CPU's drift over minutes
   on a shared host hits the competitors alike. Each process is fresh and builds the model on
   the meta device (parameters on ``meta``, buffers real), loads what it needs (setup
   seconds), compiles if it does (compile seconds), makes warm-up calls (excluded, their
   count recorded), ``repeats`` timed calls with the run's weight files evicted from the
   page cache before each (every file of the work directory: the checkpoint, its shards,
   every offload directory; ``measure.evict_files``: the cold figure; the program's own code
   stays cached, as for a user's next call, where dropping the whole cache made each call
   fault torch's code back in) and ``repeats`` timed calls without evicting them (the warm
   figure). A TensorTorrent process then times ``repeats`` pairs of the bytes its plan reads
   from disk each call read alone, by a reader with its settings, and one call, the files
   evicted before each (``call_over_read_alone``: the call against its disk's rate seconds
   before it, which the run-wide bound cannot see on a
   disk that drifts over minutes). An eager process on the CPU then times ``repeats``
   triples of a call alone, the checkpoint's last tensors (its bytes over the budget: what
   any plan under the budget must read each call) read alone by a reader with TensorTorrent's
   settings, every read verified, and both at once (``compute_with_reads_ms``: a perfect
   overlap on this machine, the CPU time of the reads and their checks taken from the
   compute, which the lower bound below leaves out; ``over_compute_with_reads_cold`` sets
   each competitor against it). Every call's output is checked against eager's
   saved output. A competitor that fails records its error and the bench goes on (a round
   that failed fails the competitor). Where the files cannot be evicted (no
   ``posix_fadvise``) or ``--no-drop`` was given, the JSON says ``page cache kept: <why>``.
4. The parent writes the JSON (``bench.common``): per regime and competitor the medians over
   every timed call of every round (cold and warm), each round's medians (``rounds``, with
   when each process started, so drift shows), setup and compile seconds as the median over
   rounds and RSS figures as the max over rounds. Ratios come three ways: the headline is the
   median over rounds of each round's ratio (both figures of a round were measured minutes
   apart at most), ``*_pooled`` the ratio of the pooled medians, ``*_by_round`` each round's.
   The lower bound is max(eager's warm time, streamed bytes / the highest read bandwidth
   measured in the run, by DiskBench or DiskReader); a competitor more than ``BOUND_NOISE``
   under its bound is listed as a violation: the rate was underestimated.

What each competitor holds in RAM (CPU mode; all hold the inputs and activations):

- ``eager``: every parameter, as anonymous memory: ``safetensors.torch.load_file`` reads the
  whole checkpoint (with ``pread``, not a mapping of the file) and the meta model takes the
  tensors (``load_state_dict(assign=True)``).
- ``accelerate``: ``infer_auto_device_map(max_memory={"cpu": budget, "disk": ...})`` then
  ``load_checkpoint_and_dispatch``, Accelerate's documented way to run a model whose weights
  do not fit. Modules mapped to ``"cpu"`` are resident tensors (Accelerate keeps room in the
  budget for the largest layer, so fewer than ``budget`` bytes). Modules mapped to ``"disk"``
  are written at setup as ``.dat`` files in the offload directory and, during each forward,
  read one module at a time (``np.memmap`` copied into a tensor) and dropped after it. Note
  that ``load_checkpoint_and_dispatch`` on a single-file checkpoint reads every tensor of it
  into RAM before writing the disk part, so its setup peak (``peak_rss_setup_bytes``) is
  more than the whole model; its peak during calls (``peak_rss_cold_calls_bytes``) is the
  honest steady state. Warm calls read the ``.dat`` files from the page cache.
- ``tensortorrent``: the meta model bound to ``model.safetensors`` (``checkpoint=``); the
  plan decides which parameters stay in host RAM within the budget, the rest is read from
  disk when needed. It never holds all weights at once, so it is the main TensorTorrent
  figure.
- ``tensortorrent_in_memory``: the real model loaded as for eager, then ``tt.compile`` with
  the budget and an ``offload_dir``: its lifetime peak includes the whole model (it was
  given the whole model), its peak during calls shows what it kept.

A generative workload (``GenerateWorkload``, ``bench.generate``): a call is one greedy
``model.generate`` of ``new_tokens`` tokens (``generation``), eager and Accelerate with the
default KV cache, TensorTorrent with ``model.forward`` compiled by ``torch.compile(backend=
"tensortorrent")`` and a static cache (its prefill and decode graphs compiled by a first call,
its compile seconds); the setup step saves eager's greedy tokens and first-step logits. A
logits processor stamps each step, so that every call also gives its prefill ms, decode
ms per step and decode tokens/s (``per_call``), pooled by ``summarize_generate_regime``
with a lower bound per decode step instead of per call. With ``--accelerate-shard-mib``
the setup step also saves the checkpoint as shards with a Hugging Face index, which
Accelerate loads one shard at a time (from the single file it holds every tensor at once).

CUDA mode (``--device cuda:0``, the GPU check): the budget is on the accelerator; ``eager``
runs on it with every weight resident, ``eager_cpu`` is CPU eager, Accelerate gets
``max_memory={0: budget, "cpu": ...}`` and TensorTorrent ``budgets={"cuda:0": budget}``.

RSS figures (bytes, from ``/proc/self/status``): ``rss_baseline_bytes`` after the imports and
the meta model, before any weight is loaded; ``peak_rss_setup_bytes`` the peak up to the
end of setup; ``peak_rss_bytes`` the process's lifetime peak (``ru_maxrss`` and every
``VmHWM`` seen); ``peak_rss_{cold,warm}_calls_bytes`` the peak over the timed calls (``VmHWM``
after resetting it through ``/proc/self/clear_refs``) and ``rss_growth_*`` each over the
baseline. RSS counts file pages mapped into the process (``RssFile``, recorded apart), so
a competitor that keeps a checkpoint mapped is charged for the pages it touched; note too
that no eviction drops pages that a process keeps mapped. ``io_read_bytes`` per
call is the kernel's count of bytes the process fetched from storage (``/proc/self/io``), an
independent check of each competitor's disk traffic.

A real RAM limit (``--mem-limit ALLOWANCE``): each competitor's process runs in a memory
cgroup of its own limited to the budget plus ALLOWANCE (the process itself: the interpreter,
torch and its competitor's library imported, the model built on meta), the page cache its
reads fill counted against it, as on a machine with that much RAM. A process over the limit is
killed by the kernel and recorded as a failed competitor ("killed by its memory limit"), not
a crash of the bench; where no cgroup can be made the JSON's ``mem_limit`` says why. A bench
may leave its reference out of the limit (``run_bench(unlimited=...)``: ``bench.generate``'s
eager); each limited process's cgroup peak (its memory and page cache) is in its result.

The modules, each importing only modules listed above it:

- ``cgroup``: a command run in a memory cgroup of its own (v1 or v2).
- ``workload``: what a bench supplies (the ``Workload`` protocol) and the output checks.
- ``generation``: a generative workload's call, ``generate()`` with each step timed.
- ``measure``: measurements inside a competitor's process (page cache, RSS, io bytes).
- ``competitors``: ``Context``, ``Competitor`` and its subclasses, by name in ``COMPETITORS``.
- ``child``: a competitor's process and the setup step (``python -m bench.offload.child``).
- ``disk``: the disk's read bandwidth (``DiskBench``, ``DiskReader``), the bound's rate.
- ``summary``: each competitor's rounds pooled into medians; the lower bound and the ratios
  (of calls, or of a generation's decode steps).
- ``runner``: ``run_bench``, the options every offload bench has, the printed summary.
"""
