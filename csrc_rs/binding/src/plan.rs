//! `plan()`, and the `Plan` and `Candidate` it returns.

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use tensortorrent_planner::{Candidate, Device, Objective, Plan, PlanError, Planner};

use crate::device::PyDevice;
use crate::error::{peak_tuples, to_py_err, PeakTuple};
use crate::graph::PyCostGraph;
use crate::simulate::{ordered_dict, timeline_tuples, RecordTuple};

/// One candidate placement the planner simulated.
#[pyclass(frozen, name = "Candidate", module = "tensortorrent_dynamo._planner")]
pub(crate) struct PyCandidate {
    inner: Candidate,
}

#[pymethods]
impl PyCandidate {
    /// Candidate name, for example `"all-on-virtual:0/streamed"`.
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }

    /// The family that proposed it, for example `"segments"`.
    #[getter]
    fn family(&self) -> &'static str {
        self.inner.family.as_str()
    }

    /// Simulated time until the last output is on the host, in seconds.
    #[getter]
    fn predicted_time_s(&self) -> f64 {
        self.inner.predicted_time_s
    }

    /// Whether every device's peak fits its budget.
    #[getter]
    fn feasible(&self) -> bool {
        self.inner.feasible
    }

    /// Simulated peak memory per device, in bytes.
    #[getter]
    fn peak_bytes(&self) -> Vec<u64> {
        self.inner.peak_bytes.clone()
    }

    /// Device index of each node.
    #[getter]
    fn node_device(&self) -> Vec<u32> {
        self.inner.node_device.clone()
    }

    /// Whether each parameter is streamed.
    #[getter]
    fn param_streamed(&self) -> Vec<bool> {
        self.inner.param_streamed.clone()
    }

    /// Whether each node's value is spilled to the host.
    #[getter]
    fn value_spilled(&self) -> Vec<bool> {
        self.inner.value_spilled.clone()
    }

    /// Prefetch depth (0: each segment reads its own parameters).
    #[getter]
    fn prefetch_depth(&self) -> u32 {
        self.inner.prefetch_depth
    }

    /// Bytes of buffers prefetches may fill ahead of use (0: none).
    #[getter]
    fn prefetch_window_bytes(&self) -> u64 {
        self.inner.prefetch_window_bytes
    }

    /// The hash of this candidate's plan (replaying its decisions gives it).
    #[getter]
    fn plan_hash(&self) -> &str {
        &self.inner.plan_hash
    }

    fn __repr__(&self) -> String {
        let c = &self.inner;
        format!(
            "Candidate(name={:?}, family={:?}, predicted_time_s={:?}, feasible={}, peak_bytes={:?})",
            c.name,
            c.family.as_str(),
            c.predicted_time_s,
            if c.feasible { "True" } else { "False" },
            c.peak_bytes
        )
    }
}

/// The chosen plan: placement, residency, segments and predictions.
#[pyclass(frozen, name = "Plan", module = "tensortorrent_dynamo._planner")]
pub(crate) struct PyPlan {
    inner: Plan,
    candidates: Vec<Py<PyCandidate>>,
    devices: Vec<Device>,
    tuples: PlanTuples,
}

/// The plan's per-node, per-segment and per-parameter vectors as Python tuples, each
/// built once: the compiler reads them an index at a time in loops over a graph's nodes,
/// and a getter that copied its vector into a new list at each call made such a loop
/// quadratic (45,000 nodes: 30 s for one lookup per node and edge).
struct PlanTuples {
    node_device: Py<PyTuple>,
    node_segment: Py<PyTuple>,
    segment_device: Py<PyTuple>,
    param_streamed: Py<PyTuple>,
    param_device: Py<PyTuple>,
    stream_param: Py<PyTuple>,
    stream_device: Py<PyTuple>,
    stream_issue_segment: Py<PyTuple>,
    stream_first_segment: Py<PyTuple>,
    stream_last_segment: Py<PyTuple>,
    value_spilled: Py<PyTuple>,
    value_reload_segment: Py<PyTuple>,
    param_home: Py<PyTuple>,
    peak_bytes: Py<PyTuple>,
}

impl PlanTuples {
    fn new(py: Python<'_>, p: &Plan) -> PyResult<Self> {
        Ok(Self {
            node_device: PyTuple::new(py, &p.node_device)?.unbind(),
            node_segment: PyTuple::new(py, &p.node_segment)?.unbind(),
            segment_device: PyTuple::new(py, &p.segment_device)?.unbind(),
            param_streamed: PyTuple::new(py, &p.param_streamed)?.unbind(),
            param_device: PyTuple::new(py, &p.param_device)?.unbind(),
            stream_param: PyTuple::new(py, &p.stream_param)?.unbind(),
            stream_device: PyTuple::new(py, &p.stream_device)?.unbind(),
            stream_issue_segment: PyTuple::new(py, &p.stream_issue_segment)?.unbind(),
            stream_first_segment: PyTuple::new(py, &p.stream_first_segment)?.unbind(),
            stream_last_segment: PyTuple::new(py, &p.stream_last_segment)?.unbind(),
            value_spilled: PyTuple::new(py, &p.value_spilled)?.unbind(),
            value_reload_segment: PyTuple::new(py, &p.value_reload_segment)?.unbind(),
            param_home: PyTuple::new(py, p.param_home.iter().map(|t| t.as_str()))?.unbind(),
            peak_bytes: PyTuple::new(py, &p.peak_bytes)?.unbind(),
        })
    }
}

#[pymethods]
impl PyPlan {
    /// Device index of each node.
    #[getter]
    fn node_device(&self, py: Python<'_>) -> Py<PyTuple> {
        self.tuples.node_device.clone_ref(py)
    }

    /// Segment index of each node.
    #[getter]
    fn node_segment(&self, py: Python<'_>) -> Py<PyTuple> {
        self.tuples.node_segment.clone_ref(py)
    }

    /// Device index of each segment.
    #[getter]
    fn segment_device(&self, py: Python<'_>) -> Py<PyTuple> {
        self.tuples.segment_device.clone_ref(py)
    }

    /// Whether each parameter is streamed (otherwise resident where used).
    #[getter]
    fn param_streamed(&self, py: Python<'_>) -> Py<PyTuple> {
        self.tuples.param_streamed.clone_ref(py)
    }

    /// Accelerator using each parameter (0 when only the host does).
    #[getter]
    fn param_device(&self, py: Python<'_>) -> Py<PyTuple> {
        self.tuples.param_device.clone_ref(py)
    }

    /// Parameter of each stay of a streamed parameter on a device, stays
    /// ordered by first segment, then parameter; a parameter used again
    /// after a gap has a stay per run of uses.
    #[getter]
    fn stream_param(&self, py: Python<'_>) -> Py<PyTuple> {
        self.tuples.stream_param.clone_ref(py)
    }

    /// Device index each stay brings its parameter to.
    #[getter]
    fn stream_device(&self, py: Python<'_>) -> Py<PyTuple> {
        self.tuples.stream_device.clone_ref(py)
    }

    /// Segment whose start issues each stay's prefetch; -1 for the start of
    /// the run.
    #[getter]
    fn stream_issue_segment(&self, py: Python<'_>) -> Py<PyTuple> {
        self.tuples.stream_issue_segment.clone_ref(py)
    }

    /// First segment each stay serves.
    #[getter]
    fn stream_first_segment(&self, py: Python<'_>) -> Py<PyTuple> {
        self.tuples.stream_first_segment.clone_ref(py)
    }

    /// Last segment each stay serves (it is evicted after it).
    #[getter]
    fn stream_last_segment(&self, py: Python<'_>) -> Py<PyTuple> {
        self.tuples.stream_last_segment.clone_ref(py)
    }

    /// Whether each node's value is spilled to the host between its
    /// producing segment and its next use.
    #[getter]
    fn value_spilled(&self, py: Python<'_>) -> Py<PyTuple> {
        self.tuples.value_spilled.clone_ref(py)
    }

    /// Segment whose start issues each spilled value's copy back to its
    /// device; -1 for values not spilled.
    #[getter]
    fn value_reload_segment(&self, py: Python<'_>) -> Py<PyTuple> {
        self.tuples.value_reload_segment.clone_ref(py)
    }

    /// How many segments ahead streamed parameters are prefetched; 0 when
    /// each segment reads its own when it starts (a "-sync" candidate).
    #[getter]
    fn prefetch_depth(&self) -> u32 {
        self.inner.prefetch_depth
    }

    /// Bytes of buffers prefetches may fill ahead of use, each issued as
    /// early as they allow (a "/window-<N>KiB" candidate); 0 when the depth
    /// alone says when.
    #[getter]
    fn prefetch_window_bytes(&self) -> u64 {
        self.inner.prefetch_window_bytes
    }

    /// The home of each parameter of the graph planned: `"host"` or
    /// `"disk"` (the planner may have moved disk-allowed parameters to disk).
    #[getter]
    fn param_home(&self, py: Python<'_>) -> Py<PyTuple> {
        self.tuples.param_home.clone_ref(py)
    }

    /// Whether the `split` graph given to `plan` was planned: then every
    /// node and parameter index of the plan refers to it.
    #[getter]
    fn split(&self) -> bool {
        self.inner.split
    }

    /// Simulated time until the last output is on the host, in seconds.
    #[getter]
    fn predicted_time_s(&self) -> f64 {
        self.inner.predicted_time_s
    }

    /// Simulated peak memory per device, in bytes.
    #[getter]
    fn peak_bytes(&self, py: Python<'_>) -> Py<PyTuple> {
        self.tuples.peak_bytes.clone_ref(py)
    }

    /// What each device holds at its peak, in device order, by index:
    /// `(device, bytes, resident, live, reached_by)` (see `peaks` of
    /// `PlanInfeasible`).
    #[getter]
    fn peaks(&self) -> Vec<PeakTuple> {
        peak_tuples(&self.inner.peaks)
    }

    /// The busiest resource's seconds of work (no schedule is faster).
    #[getter]
    fn lower_bound_s(&self) -> f64 {
        self.inner.lower_bound_s
    }

    /// Fraction of the predicted time each resource is busy, by name.
    #[getter]
    fn busy_fraction<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        ordered_dict(py, &self.inner.busy_fraction)
    }

    /// The simulated timeline: `(resource, kind, index, start_s, end_s)`.
    #[getter]
    fn timeline(&self) -> Vec<RecordTuple> {
        timeline_tuples(&self.inner.timeline, &self.devices)
    }

    /// Every candidate listed, in search order.
    #[getter]
    fn candidates(&self, py: Python<'_>) -> Vec<Py<PyCandidate>> {
        self.candidates.iter().map(|c| c.clone_ref(py)).collect()
    }

    /// Name of the chosen candidate.
    #[getter]
    fn chosen(&self) -> &str {
        &self.inner.chosen
    }

    /// What the search did and why it stopped, as a sentence.
    #[getter]
    fn report(&self) -> String {
        self.inner.report.to_string()
    }

    /// Why the search stopped.
    #[getter]
    fn stop_reason(&self) -> String {
        self.inner.report.stop_reason.to_string()
    }

    /// Placements simulated by the search.
    #[getter]
    fn candidates_simulated(&self) -> u64 {
        self.inner.report.candidates_simulated
    }

    /// Nodes simulated by the search, over all its simulations.
    #[getter]
    fn nodes_simulated(&self) -> u64 {
        self.inner.report.nodes_simulated
    }

    /// Stable hash of the inputs and the decisions (16 hex digits).
    #[getter]
    fn plan_hash(&self) -> &str {
        &self.inner.plan_hash
    }

    fn __repr__(&self) -> String {
        let p = &self.inner;
        format!(
            "Plan(chosen={:?}, predicted_time_s={:?}, peak_bytes={:?}, segments={}, plan_hash={:?})",
            p.chosen,
            p.predicted_time_s,
            p.peak_bytes,
            p.segment_device.len(),
            p.plan_hash
        )
    }
}

/// Plans `graph` over `devices` (the host first) for `objective`
/// (`"latency"`, `"memory"` or `"throughput"`); with `host_compute` false,
/// only host-only nodes run on the host. The keyword options are the
/// planner's limits and knobs (see `Planner` in the core crate), and
/// `split`, the graph planned instead when the planner moves parameters to
/// disk (see `Planner::run_with_split`). Releases the GIL while planning.
#[pyfunction]
#[pyo3(signature = (
    graph,
    devices,
    objective,
    host_compute,
    *,
    node_limit = None,
    time_limit_s = None,
    prefetch_depth = 1,
    memory_slack = Planner::DEFAULT_MEMORY_SLACK,
    split = None,
))]
pub(crate) fn plan(
    py: Python<'_>,
    graph: &Bound<'_, PyCostGraph>,
    devices: Vec<PyRef<'_, PyDevice>>,
    objective: &str,
    host_compute: bool,
    node_limit: Option<u64>,
    time_limit_s: Option<f64>,
    prefetch_depth: u32,
    memory_slack: f64,
    split: Option<&Bound<'_, PyCostGraph>>,
) -> PyResult<PyPlan> {
    let mut configured = planner(py, objective, host_compute, prefetch_depth, memory_slack)?;
    if let Some(nodes) = node_limit {
        configured = configured.with_node_limit(nodes);
    }
    if let Some(seconds) = time_limit_s {
        let limit = Duration::try_from_secs_f64(seconds).map_err(|_| {
            let msg = format!("time_limit_s is {seconds}; it must be finite and non-negative");
            to_py_err(py, &PlanError::InvalidOptions(msg))
        })?;
        configured = configured.with_time_limit(limit);
    }
    let devices: Vec<Device> = devices.into_iter().map(|d| d.inner.clone()).collect();
    let graph = &graph.get().inner;
    let split = split.map(|g| &g.get().inner);
    let planned = py
        .detach(|| configured.run_with_split(graph, split, &devices))
        .map_err(|e| to_py_err(py, &e))?;
    wrap(py, planned, devices)
}

/// The plan a search made, rebuilt from its decisions without searching
/// (same plan, same hash): for plans saved or cached by their decisions.
/// `name` (the chosen candidate) is only a label; `prefetch_depth` and
/// `prefetch_window_bytes` are the plan's recorded ones (depth 0 for a
/// synchronous candidate); `search_prefetch_depth` is the depth the search
/// was configured with (`plan(prefetch_depth=...)`), by default the recorded
/// depth, or 1 when that is 0. `graph` is the graph planned, homes included
/// (the split graph for a plan whose `split` is set). Raises
/// `InvalidPlacement` for a placement that does not fit the graph and
/// `PlanInfeasible` when it does not fit the budgets.
#[pyfunction]
#[pyo3(signature = (
    graph,
    devices,
    objective,
    host_compute,
    name,
    node_device,
    param_streamed,
    *,
    value_spilled = Vec::new(),
    prefetch_depth = 1,
    prefetch_window_bytes = 0,
    search_prefetch_depth = None,
    memory_slack = Planner::DEFAULT_MEMORY_SLACK,
))]
// PyO3 extracts Python sequences into owned vectors; the core borrows them.
#[allow(clippy::needless_pass_by_value, clippy::too_many_arguments)]
pub(crate) fn replay(
    py: Python<'_>,
    graph: &Bound<'_, PyCostGraph>,
    devices: Vec<PyRef<'_, PyDevice>>,
    objective: &str,
    host_compute: bool,
    name: &str,
    node_device: Vec<u32>,
    param_streamed: Vec<bool>,
    value_spilled: Vec<bool>,
    prefetch_depth: u32,
    prefetch_window_bytes: u64,
    search_prefetch_depth: Option<u32>,
    memory_slack: f64,
) -> PyResult<PyPlan> {
    let configured_depth = search_prefetch_depth.unwrap_or(prefetch_depth.max(1));
    let configured = planner(py, objective, host_compute, configured_depth, memory_slack)?;
    let devices: Vec<Device> = devices.into_iter().map(|d| d.inner.clone()).collect();
    let graph = &graph.get().inner;
    let planned = py
        .detach(|| {
            configured.replay(
                graph,
                &devices,
                name,
                &node_device,
                &param_streamed,
                &value_spilled,
                prefetch_depth,
                prefetch_window_bytes,
            )
        })
        .map_err(|e| to_py_err(py, &e))?;
    wrap(py, planned, devices)
}

/// The planner configured as both `plan` and `replay` take it.
fn planner(
    py: Python<'_>,
    objective: &str,
    host_compute: bool,
    prefetch_depth: u32,
    memory_slack: f64,
) -> PyResult<Planner> {
    let objective: Objective = objective.parse().map_err(|e| to_py_err(py, &e))?;
    Ok(Planner::new(objective)
        .with_host_compute(host_compute)
        .with_prefetch_depth(prefetch_depth)
        .with_memory_slack(memory_slack))
}

fn wrap(py: Python<'_>, planned: Plan, devices: Vec<Device>) -> PyResult<PyPlan> {
    let candidates = planned
        .candidates
        .iter()
        .map(|c| Py::new(py, PyCandidate { inner: c.clone() }))
        .collect::<PyResult<_>>()?;
    Ok(PyPlan {
        tuples: PlanTuples::new(py, &planned)?,
        inner: planned,
        candidates,
        devices,
    })
}
