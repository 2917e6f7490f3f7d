//! `CostGraph`: the validated flat arrays of one captured graph.

use pyo3::prelude::*;
use tensortorrent_planner::{CostGraph, PlanError, Tier};

use crate::error::to_py_err;

/// A validated cost graph (flat arrays in topological order).
#[pyclass(frozen, name = "CostGraph", module = "tensortorrent_dynamo._planner")]
pub(crate) struct PyCostGraph {
    pub(crate) inner: CostGraph,
}

#[pymethods]
impl PyCostGraph {
    #[new]
    #[pyo3(signature = (
        node_flops,
        node_out_bytes,
        node_host_only,
        input_offsets,
        input_ids,
        param_bytes,
        param_offsets,
        param_users,
        output_ids,
        *,
        node_bytes_accessed = None,
        param_home = None,
        param_disk_allowed = None,
        state = None,
        node_rate_class = None,
        node_ops = None,
        node_alias = None,
        node_kinds = None,
    ))]
    fn new(
        py: Python<'_>,
        node_flops: Vec<f64>,
        node_out_bytes: Vec<u64>,
        node_host_only: Vec<bool>,
        input_offsets: Vec<u32>,
        input_ids: Vec<u32>,
        param_bytes: Vec<u64>,
        param_offsets: Vec<u32>,
        param_users: Vec<u32>,
        output_ids: Vec<u32>,
        node_bytes_accessed: Option<Vec<u64>>,
        param_home: Option<Vec<String>>,
        param_disk_allowed: Option<Vec<bool>>,
        state: Option<Vec<(u32, u32, bool)>>,
        node_rate_class: Option<Vec<u32>>,
        node_ops: Option<Vec<u32>>,
        node_alias: Option<Vec<Option<u32>>>,
        node_kinds: Option<Vec<Vec<u32>>>,
    ) -> PyResult<Self> {
        let build = || -> Result<CostGraph, PlanError> {
            let mut graph = CostGraph::new(
                node_flops,
                node_out_bytes,
                node_host_only,
                input_offsets,
                input_ids,
                param_bytes,
                param_offsets,
                param_users,
                output_ids,
            )?;
            if let Some(bytes) = node_bytes_accessed {
                graph = graph.with_node_bytes_accessed(bytes)?;
            }
            if let Some(homes) = param_home {
                let homes = homes
                    .iter()
                    .map(|h| h.parse::<Tier>())
                    .collect::<Result<_, _>>()?;
                graph = graph.with_param_home(homes)?;
            }
            if let Some(allowed) = param_disk_allowed {
                graph = graph.with_disk_allowed(allowed)?;
            }
            if let Some(pairs) = state {
                graph = graph.with_state(&pairs)?;
            }
            if let Some(classes) = node_rate_class {
                graph = graph.with_node_rate_class(classes)?;
            }
            if let Some(ops) = node_ops {
                graph = graph.with_node_ops(ops)?;
            }
            if let Some(alias) = node_alias {
                let alias = alias.into_iter().map(|a| a.unwrap_or(u32::MAX)).collect();
                graph = graph.with_node_alias(alias)?;
            }
            if let Some(kinds) = node_kinds {
                graph = graph.with_node_kinds(&kinds)?;
            }
            Ok(graph)
        };
        build()
            .map(|inner| Self { inner })
            .map_err(|e| to_py_err(py, &e))
    }

    /// Number of nodes.
    #[getter]
    fn num_nodes(&self) -> usize {
        self.inner.num_nodes()
    }

    /// Number of parameters.
    #[getter]
    fn num_params(&self) -> usize {
        self.inner.num_params()
    }

    fn __repr__(&self) -> String {
        format!(
            "CostGraph(num_nodes={}, num_params={}, num_outputs={})",
            self.inner.num_nodes(),
            self.inner.num_params(),
            self.inner.output_ids().len()
        )
    }
}
