//! The cost graph: flat, topologically ordered arrays describing the work,
//! the data flow and the parameters of one captured graph.

use std::fmt;
use std::str::FromStr;

use crate::error::PlanError;

/// Where a parameter lives between runs (its home tier).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Tier {
    /// Host memory: the host holds it for the whole run.
    #[default]
    Host,
    /// Disk: read into host memory when a device needs it, at the host's
    /// `disk_bytes_per_s`; host memory holds it only while it is in use.
    Disk,
}

impl Tier {
    /// Every tier, in the order their names are listed.
    pub const ALL: [Self; 2] = [Self::Host, Self::Disk];

    /// The tier's name as parsed by [`str::parse`].
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Host => "host",
            Self::Disk => "disk",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Tier {
    type Err = PlanError;

    fn from_str(s: &str) -> Result<Self, PlanError> {
        Self::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| {
                invalid(format!(
                    "unknown parameter home {s:?}; valid homes are: host, disk"
                ))
            })
    }
}

/// A validated cost graph.
///
/// Nodes are numbered `0..n` in topological order. Data inputs and parameter
/// users are given in CSR form (offsets plus ids). Construction validates every
/// array; the accessors can therefore index without further checks.
#[derive(Debug, Clone, PartialEq)]
pub struct CostGraph {
    node_flops: Vec<f64>,
    node_out_bytes: Vec<u64>,
    node_host_only: Vec<bool>,
    input_offsets: Vec<u32>,
    input_ids: Vec<u32>,
    param_bytes: Vec<u64>,
    param_offsets: Vec<u32>,
    param_users: Vec<u32>,
    output_ids: Vec<u32>,
    node_bytes_accessed: Vec<u64>,
    node_rate_class: Vec<u32>,
    // per node: the ops it runs, each paying its device's fixed cost; `None`:
    // one for a node that computes or moves bytes, none otherwise
    node_ops: Option<Vec<u32>>,
    // per node: the input whose storage its value shares (a view of it), or
    // `u32::MAX` when it has storage of its own
    node_alias: Vec<u32>,
    // per node (offsets into `node_kind_ids`): the kinds of op it runs; none
    // set: no kinds known
    node_kind_offsets: Vec<u32>,
    node_kind_ids: Vec<u32>,
    num_kinds: u32,
    param_home: Vec<Tier>,
    param_disk_allowed: Vec<bool>,
    // per node: for a graph output that is the new value of a state input (a
    // KV cache buffer written in place), that input; `u32::MAX` otherwise
    output_state: Vec<u32>,
    state_input: Vec<bool>,
    // per node: whether it is a state's new value written into the state itself
    state_in_place: Vec<bool>,
    state: Vec<(u32, u32, bool)>,
    // Derived indices, built once at construction.
    node_param_offsets: Vec<u32>,
    node_param_ids: Vec<u32>,
    consumer_offsets: Vec<u32>,
    consumer_ids: Vec<u32>,
    is_output: Vec<bool>,
}

/// [`PlanError::InvalidGraph`] unless array `what` has `len` entries, as
/// many as `counted` has (`count`).
fn check_len(what: &str, len: usize, count: usize, counted: &str) -> Result<(), PlanError> {
    if len == count {
        return Ok(());
    }
    Err(invalid(format!(
        "{what} has {len} entries but {counted} has {count}"
    )))
}

fn invalid(msg: impl Into<String>) -> PlanError {
    PlanError::InvalidGraph(msg.into())
}

/// Checks a CSR offsets array: `count + 1` entries, starting at 0,
/// non-decreasing, ending at `ids_len`.
fn check_offsets(
    what: &str,
    offsets: &[u32],
    count: usize,
    ids_what: &str,
    ids_len: usize,
) -> Result<(), PlanError> {
    if offsets.len() != count + 1 {
        return Err(invalid(format!(
            "{what} has {} entries, expected {} (one more than the {count} rows)",
            offsets.len(),
            count + 1
        )));
    }
    if offsets[0] != 0 {
        return Err(invalid(format!("{what}[0] is {}, expected 0", offsets[0])));
    }
    for (i, w) in offsets.windows(2).enumerate() {
        if w[1] < w[0] {
            return Err(invalid(format!(
                "{what} decreases at index {}: {} > {}",
                i + 1,
                w[0],
                w[1]
            )));
        }
    }
    let last = offsets[count] as usize;
    if last != ids_len {
        return Err(invalid(format!(
            "{what}[{count}] is {last} but {ids_what} has {ids_len} entries"
        )));
    }
    Ok(())
}

/// Builds a deduplicated CSR from `(row, value)` pairs given row by row.
/// Rows are visited in order; values inside a row are sorted and deduplicated.
fn build_csr(rows: usize, pairs: &[(u32, u32)]) -> (Vec<u32>, Vec<u32>) {
    let mut counts = vec![0u32; rows + 1];
    for &(r, _) in pairs {
        counts[r as usize + 1] += 1;
    }
    for i in 0..rows {
        counts[i + 1] += counts[i];
    }
    let mut fill = counts.clone();
    let mut ids = vec![0u32; pairs.len()];
    for &(r, v) in pairs {
        let slot = &mut fill[r as usize];
        ids[*slot as usize] = v;
        *slot += 1;
    }
    // Sort and deduplicate each row, compacting in place.
    let mut offsets = Vec::with_capacity(rows + 1);
    offsets.push(0u32);
    let mut write = 0usize;
    for r in 0..rows {
        let (lo, hi) = (counts[r] as usize, counts[r + 1] as usize);
        ids[lo..hi].sort_unstable();
        let mut prev: Option<u32> = None;
        for k in lo..hi {
            let v = ids[k];
            if prev != Some(v) {
                ids[write] = v;
                write += 1;
                prev = Some(v);
            }
        }
        offsets.push(write as u32);
    }
    ids.truncate(write);
    (offsets, ids)
}

impl CostGraph {
    /// [`PlanError::InvalidGraph`] unless `len`, the length of the per-node
    /// array `what`, is the node count.
    fn check_per_node(&self, what: &str, len: usize) -> Result<(), PlanError> {
        check_len(what, len, self.num_nodes(), "node_flops")
    }

    /// [`PlanError::InvalidGraph`] unless `len`, the length of the per-parameter
    /// array `what`, is the parameter count.
    fn check_per_param(&self, what: &str, len: usize) -> Result<(), PlanError> {
        check_len(what, len, self.num_params(), "param_bytes")
    }

    /// Builds and validates a cost graph.
    ///
    /// * `node_flops`, `node_out_bytes`, `node_host_only`: one entry per node.
    /// * `input_offsets` (`n + 1` entries) and `input_ids`: the data inputs of
    ///   each node; every input id must be smaller than its consumer's id.
    /// * `param_bytes`: one entry per parameter.
    /// * `param_offsets` (`p + 1` entries) and `param_users`: the nodes using
    ///   each parameter.
    /// * `output_ids`: nodes whose values are graph outputs.
    ///
    /// Repeated ids (a node reading the same input twice, a parameter listing
    /// the same user twice) are accepted and counted once.
    ///
    /// # Errors
    /// [`PlanError::InvalidGraph`] naming the first offending array and index.
    pub fn new(
        node_flops: Vec<f64>,
        node_out_bytes: Vec<u64>,
        node_host_only: Vec<bool>,
        input_offsets: Vec<u32>,
        input_ids: Vec<u32>,
        param_bytes: Vec<u64>,
        param_offsets: Vec<u32>,
        param_users: Vec<u32>,
        output_ids: Vec<u32>,
    ) -> Result<Self, PlanError> {
        let n = node_flops.len();
        if n >= u32::MAX as usize {
            return Err(invalid(format!(
                "{n} nodes is too many (limit {})",
                u32::MAX - 1
            )));
        }
        if node_out_bytes.len() != n {
            return Err(invalid(format!(
                "node_out_bytes has {} entries but node_flops has {n}",
                node_out_bytes.len()
            )));
        }
        if node_host_only.len() != n {
            return Err(invalid(format!(
                "node_host_only has {} entries but node_flops has {n}",
                node_host_only.len()
            )));
        }
        if let Some((i, f)) = node_flops
            .iter()
            .enumerate()
            .find(|(_, f)| !f.is_finite() || **f < 0.0)
        {
            return Err(invalid(format!(
                "node_flops[{i}] is {f}; flops must be finite and non-negative"
            )));
        }
        check_offsets(
            "input_offsets",
            &input_offsets,
            n,
            "input_ids",
            input_ids.len(),
        )?;
        for v in 0..n {
            let (lo, hi) = (input_offsets[v] as usize, input_offsets[v + 1] as usize);
            for (k, &u) in input_ids[lo..hi].iter().enumerate() {
                if u as usize >= n {
                    return Err(invalid(format!(
                        "input_ids[{}] = {u} (an input of node {v}) is out of range for {n} nodes",
                        lo + k
                    )));
                }
                if u as usize >= v {
                    return Err(invalid(format!(
                        "input_ids[{}] = {u} is an input of node {v} but does not come before it; \
                         nodes must be in topological order",
                        lo + k
                    )));
                }
            }
        }
        let p = param_bytes.len();
        if p >= u32::MAX as usize {
            return Err(invalid(format!(
                "{p} params is too many (limit {})",
                u32::MAX - 1
            )));
        }
        check_offsets(
            "param_offsets",
            &param_offsets,
            p,
            "param_users",
            param_users.len(),
        )?;
        for (k, &u) in param_users.iter().enumerate() {
            if u as usize >= n {
                return Err(invalid(format!(
                    "param_users[{k}] = {u} is out of range for {n} nodes"
                )));
            }
        }
        for (k, &o) in output_ids.iter().enumerate() {
            if o as usize >= n {
                return Err(invalid(format!(
                    "output_ids[{k}] = {o} is out of range for {n} nodes"
                )));
            }
        }

        // node -> params (deduplicated).
        let mut pairs = Vec::with_capacity(param_users.len());
        for q in 0..p {
            let (lo, hi) = (param_offsets[q] as usize, param_offsets[q + 1] as usize);
            for &u in &param_users[lo..hi] {
                pairs.push((u, q as u32));
            }
        }
        let (node_param_offsets, node_param_ids) = build_csr(n, &pairs);
        // node -> consumers (deduplicated).
        pairs.clear();
        for v in 0..n {
            let (lo, hi) = (input_offsets[v] as usize, input_offsets[v + 1] as usize);
            for &u in &input_ids[lo..hi] {
                pairs.push((u, v as u32));
            }
        }
        let (consumer_offsets, consumer_ids) = build_csr(n, &pairs);
        let mut is_output = vec![false; n];
        for &o in &output_ids {
            is_output[o as usize] = true;
        }

        Ok(Self {
            node_flops,
            node_out_bytes,
            node_host_only,
            input_offsets,
            input_ids,
            param_bytes,
            param_offsets,
            param_users,
            output_ids,
            node_bytes_accessed: vec![0; n],
            node_rate_class: vec![0; n],
            node_ops: None,
            node_alias: vec![u32::MAX; n],
            node_kind_offsets: vec![0; n + 1],
            node_kind_ids: Vec::new(),
            num_kinds: 0,
            param_home: vec![Tier::Host; p],
            param_disk_allowed: vec![false; p],
            output_state: vec![u32::MAX; n],
            state_input: vec![false; n],
            state_in_place: vec![false; n],
            state: Vec::new(),
            node_param_offsets,
            node_param_ids,
            consumer_offsets,
            consumer_ids,
            is_output,
        })
    }

    /// Sets the bytes each node moves through device memory (reads plus
    /// writes); by default 0, so a node's time is its compute alone.
    ///
    /// # Errors
    /// [`PlanError::InvalidGraph`] when the length is not the node count.
    pub fn with_node_bytes_accessed(mut self, bytes: Vec<u64>) -> Result<Self, PlanError> {
        self.check_per_node("node_bytes_accessed", bytes.len())?;
        self.node_bytes_accessed = bytes;
        Ok(self)
    }

    /// Sets the rate class of each node: which of a device's compute rates
    /// its FLOPs run at (`Device::class_rate`); by default 0, every node at
    /// the device's `flops_per_s`.
    ///
    /// # Errors
    /// [`PlanError::InvalidGraph`] when the length is not the node count.
    pub fn with_node_rate_class(mut self, classes: Vec<u32>) -> Result<Self, PlanError> {
        self.check_per_node("node_rate_class", classes.len())?;
        self.node_rate_class = classes;
        Ok(self)
    }

    /// Sets the ops each node runs on its device, each paying the device's
    /// fixed cost (`Device::latency_s`): 0 for a node that runs nothing (a
    /// graph input, an item taken from a tuple), 1 for an op, a view
    /// included (it moves no bytes, but is still called). By default a node
    /// runs one op when it computes or moves bytes, none otherwise.
    ///
    /// # Errors
    /// [`PlanError::InvalidGraph`] when the length is not the node count.
    pub fn with_node_ops(mut self, ops: Vec<u32>) -> Result<Self, PlanError> {
        self.check_per_node("node_ops", ops.len())?;
        self.node_ops = Some(ops);
        Ok(self)
    }

    /// Sets, per node, the input whose storage its value shares (a view of
    /// it; `u32::MAX` for none, the default). Such a node allocates nothing on
    /// its device, and the input's copy there lives as long as the view's
    /// does (a view keeps its base's storage alive). A copy of the view to
    /// another device is a new tensor of its own bytes.
    ///
    /// # Errors
    /// [`PlanError::InvalidGraph`] when the length is not the node count or a
    /// node's alias is not one of its inputs.
    pub fn with_node_alias(mut self, alias: Vec<u32>) -> Result<Self, PlanError> {
        self.check_per_node("node_alias", alias.len())?;
        for (v, &a) in alias.iter().enumerate() {
            if a != u32::MAX && !self.inputs(v).contains(&a) {
                return Err(invalid(format!(
                    "node_alias[{v}] = {a} is not an input of node {v}"
                )));
            }
        }
        self.node_alias = alias;
        Ok(self)
    }

    /// Sets the kinds of op each node runs (ids from 0, one per kind: the
    /// node's own op and the views of weights it runs): a segment pays its
    /// device's `Device::cold_latency_s` for each kind the first time it runs
    /// it. By default no node has a kind.
    ///
    /// # Errors
    /// [`PlanError::InvalidGraph`] when the length is not the node count or a
    /// node lists a kind twice.
    pub fn with_node_kinds(mut self, kinds: &[Vec<u32>]) -> Result<Self, PlanError> {
        self.check_per_node("node_kinds", kinds.len())?;
        let mut offsets = Vec::with_capacity(kinds.len() + 1);
        let mut ids = Vec::new();
        offsets.push(0);
        for (v, own) in kinds.iter().enumerate() {
            for (i, k) in own.iter().enumerate() {
                if own[..i].contains(k) {
                    return Err(invalid(format!("node_kinds[{v}] lists kind {k} twice")));
                }
            }
            ids.extend_from_slice(own);
            offsets.push(u32::try_from(ids.len()).map_err(|_| invalid("too many node kinds"))?);
        }
        self.num_kinds = ids.iter().max().map_or(0, |&k| k + 1);
        self.node_kind_offsets = offsets;
        self.node_kind_ids = ids;
        Ok(self)
    }

    /// Sets the home tier of each parameter; by default every parameter's
    /// home is the host.
    ///
    /// # Errors
    /// [`PlanError::InvalidGraph`] when the length is not the parameter count.
    pub fn with_param_home(mut self, home: Vec<Tier>) -> Result<Self, PlanError> {
        self.check_per_param("param_home", home.len())?;
        self.param_home = home;
        Ok(self)
    }

    /// Sets which parameters whose home is the host the planner may move to
    /// disk when the host budget cannot hold them (see
    /// [`crate::Planner::run_with_split`]); by default none. The flag means
    /// nothing for a parameter whose home is disk already.
    ///
    /// # Errors
    /// [`PlanError::InvalidGraph`] when the length is not the parameter count.
    pub fn with_disk_allowed(mut self, allowed: Vec<bool>) -> Result<Self, PlanError> {
        self.check_per_param("param_disk_allowed", allowed.len())?;
        self.param_disk_allowed = allowed;
        Ok(self)
    }

    /// Declares state: each `(input, output, in_place)` triple is a graph
    /// input the graph writes in place (a KV cache buffer) and the output that
    /// is its new value. The state lives on the device its input node is
    /// placed on, between calls too: its new value goes there at the end of a
    /// call (no copy when it is made there), not to the host as other outputs
    /// do. With `in_place`, the output node writes into the state itself
    /// (`index_copy_`): it allocates nothing where the state is, and a state
    /// input that may move lives wherever its update runs (see
    /// [`crate::placement`]).
    ///
    /// # Errors
    /// [`PlanError::InvalidGraph`] when an input is not a node without inputs
    /// that comes before its output, when an output is not a graph output,
    /// or when an output is named twice.
    pub fn with_state(mut self, pairs: &[(u32, u32, bool)]) -> Result<Self, PlanError> {
        let n = self.num_nodes();
        for (k, &(input, output, in_place)) in pairs.iter().enumerate() {
            let (i, o) = (input as usize, output as usize);
            if i >= n || o >= n {
                return Err(invalid(format!(
                    "state[{k}] = ({input}, {output}) is out of range for {n} nodes"
                )));
            }
            if !self.inputs(i).is_empty() || i >= o {
                return Err(invalid(format!(
                    "state[{k}]: node {input} is not a graph input coming before its new \
                     value {output}"
                )));
            }
            if !self.is_output[o] {
                return Err(invalid(format!(
                    "state[{k}]: node {output} is not a graph output"
                )));
            }
            if self.output_state[o] != u32::MAX {
                return Err(invalid(format!(
                    "state[{k}]: node {output} is the new value of two state inputs"
                )));
            }
            self.output_state[o] = input;
            self.state_input[i] = true;
            self.state_in_place[o] = in_place;
        }
        self.state = pairs.to_vec();
        Ok(self)
    }

    /// For a graph output that is the new value of a state input, that input.
    #[must_use]
    pub fn state_of_output(&self, node: usize) -> Option<usize> {
        let s = self.output_state[node];
        (s != u32::MAX).then_some(s as usize)
    }

    /// Whether `node` is the input of a state pair.
    #[must_use]
    pub fn is_state_input(&self, node: usize) -> bool {
        self.state_input[node]
    }

    /// Whether `node` is a state's new value written into the state itself.
    #[must_use]
    pub fn is_in_place(&self, node: usize) -> bool {
        self.state_in_place[node]
    }

    /// The `(input, output, in_place)` state triples, as given.
    #[must_use]
    pub fn state_pairs(&self) -> &[(u32, u32, bool)] {
        &self.state
    }

    /// Number of nodes.
    #[must_use]
    pub fn num_nodes(&self) -> usize {
        self.node_flops.len()
    }

    /// Number of parameters.
    #[must_use]
    pub fn num_params(&self) -> usize {
        self.param_bytes.len()
    }

    /// Floating-point operations of each node.
    #[must_use]
    pub fn node_flops(&self) -> &[f64] {
        &self.node_flops
    }

    /// Size in bytes of each node's output value.
    #[must_use]
    pub fn node_out_bytes(&self) -> &[u64] {
        &self.node_out_bytes
    }

    /// Whether each node must run on the host.
    #[must_use]
    pub fn node_host_only(&self) -> &[bool] {
        &self.node_host_only
    }

    /// CSR offsets of the data inputs (`n + 1` entries).
    #[must_use]
    pub fn input_offsets(&self) -> &[u32] {
        &self.input_offsets
    }

    /// CSR ids of the data inputs, as given.
    #[must_use]
    pub fn input_ids(&self) -> &[u32] {
        &self.input_ids
    }

    /// Size in bytes of each parameter.
    #[must_use]
    pub fn param_bytes(&self) -> &[u64] {
        &self.param_bytes
    }

    /// CSR offsets of the parameter users (`p + 1` entries).
    #[must_use]
    pub fn param_offsets(&self) -> &[u32] {
        &self.param_offsets
    }

    /// CSR ids of the parameter users, as given.
    #[must_use]
    pub fn param_users_flat(&self) -> &[u32] {
        &self.param_users
    }

    /// Bytes each node moves through device memory.
    #[must_use]
    pub fn node_bytes_accessed(&self) -> &[u64] {
        &self.node_bytes_accessed
    }

    /// Rate class of each node (see `with_node_rate_class`).
    #[must_use]
    pub fn node_rate_class(&self) -> &[u32] {
        &self.node_rate_class
    }

    /// The ops node `v` runs, each paying its device's fixed cost (see
    /// `with_node_ops`).
    #[must_use]
    pub fn node_ops(&self, v: usize) -> u32 {
        match &self.node_ops {
            Some(ops) => ops[v],
            None => u32::from(self.node_flops[v] > 0.0 || self.node_bytes_accessed[v] > 0),
        }
    }

    /// The ops of every node, where they were set (`with_node_ops`).
    #[must_use]
    pub fn explicit_node_ops(&self) -> Option<&[u32]> {
        self.node_ops.as_deref()
    }

    /// The input whose storage node `v`'s value shares, if it is a view
    /// (see `with_node_alias`).
    #[must_use]
    pub fn node_alias(&self, v: usize) -> Option<usize> {
        let a = self.node_alias[v];
        (a != u32::MAX).then_some(a as usize)
    }

    /// Per node, the input it is a view of (`u32::MAX`: none).
    #[must_use]
    pub fn node_alias_ids(&self) -> &[u32] {
        &self.node_alias
    }

    /// The kinds of op node `v` runs (see `with_node_kinds`).
    #[must_use]
    pub fn node_kinds(&self, v: usize) -> &[u32] {
        let (lo, hi) = (self.node_kind_offsets[v], self.node_kind_offsets[v + 1]);
        &self.node_kind_ids[lo as usize..hi as usize]
    }

    /// How many kinds of op the nodes run (one more than the largest id).
    #[must_use]
    pub fn num_kinds(&self) -> usize {
        self.num_kinds as usize
    }

    /// Every node's kinds, flat, and where each node's start (`n + 1`
    /// offsets).
    #[must_use]
    pub fn node_kinds_flat(&self) -> (&[u32], &[u32]) {
        (&self.node_kind_offsets, &self.node_kind_ids)
    }

    /// Home tier of each parameter.
    #[must_use]
    pub fn param_home(&self) -> &[Tier] {
        &self.param_home
    }

    /// Whether the planner may move each parameter whose home is the host to
    /// disk.
    #[must_use]
    pub fn param_disk_allowed(&self) -> &[bool] {
        &self.param_disk_allowed
    }

    /// Whether some parameter whose home is the host may move to disk.
    pub(crate) fn may_move_to_disk(&self) -> bool {
        self.param_home
            .iter()
            .zip(&self.param_disk_allowed)
            .any(|(&home, &allowed)| home == Tier::Host && allowed)
    }

    /// The graph with every parameter that may move to disk homed there.
    pub(crate) fn moved_to_disk(&self) -> Self {
        let mut g = self.clone();
        for (home, &allowed) in g.param_home.iter_mut().zip(&self.param_disk_allowed) {
            if allowed {
                *home = Tier::Disk;
            }
        }
        g
    }

    /// Whether any parameter's home is disk.
    #[must_use]
    pub fn has_disk_params(&self) -> bool {
        self.param_home.contains(&Tier::Disk)
    }

    /// Nodes whose values are graph outputs, as given.
    #[must_use]
    pub fn output_ids(&self) -> &[u32] {
        &self.output_ids
    }

    /// The data inputs of `node`, as given (may repeat).
    #[must_use]
    pub fn inputs(&self, node: usize) -> &[u32] {
        let (lo, hi) = (self.input_offsets[node], self.input_offsets[node + 1]);
        &self.input_ids[lo as usize..hi as usize]
    }

    /// The nodes using `param`, as given (may repeat, any order).
    #[must_use]
    pub fn param_users(&self, param: usize) -> &[u32] {
        let (lo, hi) = (self.param_offsets[param], self.param_offsets[param + 1]);
        &self.param_users[lo as usize..hi as usize]
    }

    /// The distinct parameters used by `node`, ascending.
    #[must_use]
    pub fn node_params(&self, node: usize) -> &[u32] {
        let (lo, hi) = (
            self.node_param_offsets[node],
            self.node_param_offsets[node + 1],
        );
        &self.node_param_ids[lo as usize..hi as usize]
    }

    /// The distinct nodes consuming `node`'s value, ascending.
    #[must_use]
    pub fn consumers(&self, node: usize) -> &[u32] {
        let (lo, hi) = (self.consumer_offsets[node], self.consumer_offsets[node + 1]);
        &self.consumer_ids[lo as usize..hi as usize]
    }

    /// Whether `node`'s value is a graph output.
    #[must_use]
    pub fn is_output(&self, node: usize) -> bool {
        self.is_output[node]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_nodes() -> CostGraph {
        CostGraph::new(
            vec![0.0, 1.0],
            vec![4, 8],
            vec![true, false],
            vec![0, 0, 2],
            vec![0, 0],
            vec![16],
            vec![0, 2],
            vec![1, 1],
            vec![1, 1],
        )
        .unwrap()
    }

    #[test]
    fn derived_indices_are_deduplicated() {
        let g = two_nodes();
        assert_eq!(g.consumers(0), &[1]);
        assert_eq!(g.node_params(1), &[0]);
        assert!(g.node_params(0).is_empty());
        assert!(g.is_output(1));
        assert!(!g.is_output(0));
        assert_eq!(g.inputs(1), &[0, 0]);
    }

    #[test]
    fn csr_rows_are_sorted() {
        let (off, ids) = build_csr(3, &[(2, 5), (0, 3), (2, 1), (2, 5), (0, 3)]);
        assert_eq!(off, vec![0, 1, 1, 3]);
        assert_eq!(ids, vec![3, 1, 5]);
    }
}
