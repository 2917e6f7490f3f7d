//! `exhaustive()` and the `Optimum` it returns.

use pyo3::prelude::*;
use tensortorrent_planner::{Device, Optimum};

use crate::device::PyDevice;
use crate::error::to_py_err;
use crate::graph::PyCostGraph;

/// The fastest placement that fits, found by enumeration.
#[pyclass(frozen, name = "Optimum", module = "tensortorrent_dynamo._planner")]
pub(crate) struct PyOptimum {
    inner: Optimum,
}

#[pymethods]
impl PyOptimum {
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

    /// Simulated time, in seconds.
    #[getter]
    fn predicted_time_s(&self) -> f64 {
        self.inner.predicted_time_s
    }

    /// Simulated peak memory per device, in bytes.
    #[getter]
    fn peak_bytes(&self) -> Vec<u64> {
        self.inner.peak_bytes.clone()
    }

    /// Placements simulated.
    #[getter]
    fn placements(&self) -> u64 {
        self.inner.placements
    }

    fn __repr__(&self) -> String {
        format!(
            "Optimum(predicted_time_s={:?}, node_device={:?}, param_streamed={:?}, placements={})",
            self.inner.predicted_time_s,
            self.inner.node_device,
            self.inner.param_streamed,
            self.inner.placements
        )
    }
}

/// The fastest placement of `graph` on `devices` that fits every budget,
/// by simulating every placement the planner could choose (`None` when none
/// fits); raises `OptionsError` when that could exceed `limit` placements.
/// For checking the planner on small graphs. Releases the GIL.
#[pyfunction]
#[pyo3(signature = (graph, devices, host_compute, *, prefetch_depth = 1, limit = 1_000_000))]
pub(crate) fn exhaustive(
    py: Python<'_>,
    graph: &Bound<'_, PyCostGraph>,
    devices: Vec<PyRef<'_, PyDevice>>,
    host_compute: bool,
    prefetch_depth: u32,
    limit: u64,
) -> PyResult<Option<PyOptimum>> {
    let devices: Vec<Device> = devices.into_iter().map(|d| d.inner.clone()).collect();
    let graph = &graph.get().inner;
    let found = py
        .detach(|| {
            tensortorrent_planner::exhaustive(graph, &devices, host_compute, prefetch_depth, limit)
        })
        .map_err(|e| to_py_err(py, &e))?;
    Ok(found.map(|inner| PyOptimum { inner }))
}
