//! `plan()`, and the `Plan` and `Candidate` it returns.

use pyo3::prelude::*;
use tensortorrent_planner::{Candidate, Device, Objective, Plan};

use crate::device::PyDevice;
use crate::error::to_py_err;
use crate::graph::PyCostGraph;

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

    fn __repr__(&self) -> String {
        let c = &self.inner;
        format!(
            "Candidate(name={:?}, predicted_time_s={:?}, feasible={}, peak_bytes={:?})",
            c.name,
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
}

#[pymethods]
impl PyPlan {
    /// Device index of each node.
    #[getter]
    fn node_device(&self) -> Vec<u32> {
        self.inner.node_device.clone()
    }

    /// Segment index of each node.
    #[getter]
    fn node_segment(&self) -> Vec<u32> {
        self.inner.node_segment.clone()
    }

    /// Device index of each segment.
    #[getter]
    fn segment_device(&self) -> Vec<u32> {
        self.inner.segment_device.clone()
    }

    /// Whether each parameter is streamed (otherwise resident where used).
    #[getter]
    fn param_streamed(&self) -> Vec<bool> {
        self.inner.param_streamed.clone()
    }

    /// Accelerator using each parameter (0 when only the host does).
    #[getter]
    fn param_device(&self) -> Vec<u32> {
        self.inner.param_device.clone()
    }

    /// First segment using each streamed parameter; -1 when not streamed.
    #[getter]
    fn param_prefetch_segment(&self) -> Vec<i64> {
        self.inner.param_prefetch_segment.clone()
    }

    /// Last segment using each streamed parameter; -1 when not streamed.
    #[getter]
    fn param_evict_segment(&self) -> Vec<i64> {
        self.inner.param_evict_segment.clone()
    }

    /// Simulated time until the last output is on the host, in seconds.
    #[getter]
    fn predicted_time_s(&self) -> f64 {
        self.inner.predicted_time_s
    }

    /// Simulated peak memory per device, in bytes.
    #[getter]
    fn peak_bytes(&self) -> Vec<u64> {
        self.inner.peak_bytes.clone()
    }

    /// Every candidate considered, in search order.
    #[getter]
    fn candidates(&self, py: Python<'_>) -> Vec<Py<PyCandidate>> {
        self.candidates.iter().map(|c| c.clone_ref(py)).collect()
    }

    /// Name of the chosen candidate.
    #[getter]
    fn chosen(&self) -> &str {
        &self.inner.chosen
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
/// only host-only nodes run on the host. Releases the GIL while planning.
#[pyfunction]
#[pyo3(signature = (graph, devices, objective, host_compute))]
pub(crate) fn plan(
    py: Python<'_>,
    graph: &Bound<'_, PyCostGraph>,
    devices: Vec<PyRef<'_, PyDevice>>,
    objective: &str,
    host_compute: bool,
) -> PyResult<PyPlan> {
    let objective: Objective = objective.parse().map_err(|e| to_py_err(py, &e))?;
    let devices: Vec<Device> = devices.into_iter().map(|d| d.inner.clone()).collect();
    let graph = &graph.get().inner;
    let planned = py
        .detach(|| tensortorrent_planner::plan(graph, &devices, objective, host_compute))
        .map_err(|e| to_py_err(py, &e))?;
    let candidates = planned
        .candidates
        .iter()
        .map(|c| Py::new(py, PyCandidate { inner: c.clone() }))
        .collect::<PyResult<_>>()?;
    Ok(PyPlan {
        inner: planned,
        candidates,
    })
}
