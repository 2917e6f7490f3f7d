//! Contiguous segments over the topological order by dynamic programming.
//!
//! The DP walks the nodes in order and keeps, for each device, the least
//! estimated time to have run every node so far with the current node on
//! that device (`O(n · devices²)`). Its estimate is sequential and coarse;
//! the simulator judges what it proposes:
//! * a node costs its time on the device, plus the copy back of a graph
//!   output made on an accelerator;
//! * switching devices before a node costs the bytes of every value made
//!   before it and read at or after it, over the link between the devices
//!   (through the host between accelerators);
//! * the parameters a node reads (each parameter's bytes split evenly over
//!   its users) cost nothing on an accelerator while they fit its capacity
//!   (they will be resident), and their exposed copy time once it is full:
//!   when staying on the device, the copy less the compute since the
//!   previous parameter-reading node (which the prefetch overlaps), and
//!   after a switch the whole copy. On the host only reads from disk cost,
//!   and where the graph reads from disk, the host's nodes cost their time
//!   slowed as while reads run (`Device::read_slowdown`) throughout.
//!
//! Each state carries the bytes its own best path made resident on each
//! device, so a device fills up to its capacity and the path then moves on
//! to the next device with room, to the host, or streams: unequal devices
//! end up with unequal shares. Keeping one path per state makes this a
//! heuristic (the best path to a state may have spent capacity another
//! path would have saved), which the simulator and local search correct.

use crate::device::Device;
use crate::graph::{CostGraph, Tier};
use crate::placement::HOST;

/// The DP's per-node estimates for one graph and device list.
pub(crate) struct Costs<'a> {
    g: &'a CostGraph,
    nd: usize,
    /// `[v * nd + d]`: node time of `v` on `d`, with an output's copy back.
    time: Vec<f64>,
    /// `[v * nd + d]`: compute on `d` since the previous node reading
    /// parameters (the window a prefetch for `v` overlaps).
    window: Vec<f64>,
    /// `[v * nd + d]`: seconds to bring `v`'s share of its parameters to
    /// `d` (disk reads only, on the host).
    copy: Vec<f64>,
    /// Per node: its share of the bytes of the parameters it reads (what
    /// making them resident takes of an accelerator's capacity).
    bytes: Vec<f64>,
    /// Bytes of values made before each node and read at or after it.
    cut: Vec<f64>,
    /// `[from * nd + to]`: seconds per byte to move a value between devices
    /// (through the host between accelerators).
    link: Vec<f64>,
}

impl<'a> Costs<'a> {
    /// Estimates for `g` on `devices`; parameters marked `free` cost nothing
    /// (they are resident by decree).
    pub(crate) fn new(g: &'a CostGraph, devices: &'a [Device], free: &[bool]) -> Self {
        let n = g.num_nodes();
        let nd = devices.len();
        let host = &devices[HOST as usize];
        let mut host_share = vec![0.0f64; n];
        let mut disk_share = vec![0.0f64; n];
        // each read's fixed cost, shared among its parameter's users as its bytes are
        let mut disk_fixed = vec![0.0f64; n];
        for (q, &is_free) in free.iter().enumerate() {
            let users = g.param_users(q);
            if is_free || users.is_empty() {
                continue;
            }
            let param_bytes = g.param_bytes()[q] as f64;
            let share = param_bytes / users.len() as f64;
            let on_disk = g.param_home()[q] == Tier::Disk;
            let target = if on_disk {
                &mut disk_share
            } else {
                &mut host_share
            };
            for &u in users {
                target[u as usize] += share;
                if on_disk {
                    disk_fixed[u as usize] += host.read_fixed_s(param_bytes) / users.len() as f64;
                }
            }
        }
        let mut time = vec![0.0f64; n * nd];
        let mut window = vec![0.0f64; n * nd];
        let mut copy = vec![0.0f64; n * nd];
        let mut bytes = vec![0.0f64; n];
        let mut since = vec![0.0f64; nd];
        let reads_disk = g.has_disk_params();
        for v in 0..n {
            bytes[v] = host_share[v] + disk_share[v];
            let disk_read = disk_fixed[v] + disk_share[v] / host.disk_bytes_per_s;
            for (d, dev) in devices.iter().enumerate() {
                let k = v * nd + d;
                let mut t = dev.node_time(
                    g.node_flops()[v],
                    g.node_bytes_accessed()[v],
                    g.node_rate_class()[v],
                    g.node_ops(v),
                );
                if d == HOST as usize && reads_disk {
                    // not knowing when reads run, the host is taken as slowed throughout
                    t *= dev.read_slowdown;
                }
                window[k] = since[d];
                since[d] = if bytes[v] > 0.0 { t } else { since[d] + t };
                if d == HOST as usize {
                    copy[k] = disk_read;
                } else {
                    copy[k] = bytes[v] / dev.h2d_bytes_per_s + disk_read;
                    if g.is_output(v) {
                        t += g.node_out_bytes()[v] as f64 / dev.d2h_bytes_per_s;
                    }
                }
                time[k] = t;
            }
        }

        let mut delta = vec![0.0f64; n + 1];
        for x in 0..n {
            if let Some(&last) = g.consumers(x).last() {
                let b = g.node_out_bytes()[x] as f64;
                delta[x + 1] += b;
                delta[last as usize + 1] -= b;
            }
        }
        let mut cut = Vec::with_capacity(n);
        let mut running = 0.0;
        for d in &delta[..n] {
            running += d;
            cut.push(running.max(0.0));
        }
        let per_byte = |rate: f64, is_host: bool| if is_host { 0.0 } else { 1.0 / rate };
        let mut link = Vec::with_capacity(nd * nd);
        for from in devices {
            for to in devices {
                link.push(
                    per_byte(from.d2h_bytes_per_s, from.is_host)
                        + per_byte(to.h2d_bytes_per_s, to.is_host),
                );
            }
        }
        Self {
            g,
            nd,
            time,
            window,
            copy,
            bytes,
            cut,
            link,
        }
    }
}

/// The least-cost placement where nodes that may leave the host run on
/// `allowed` and each accelerator holds at most `capacity[d]` bytes of
/// resident parameters. Ties keep the current device, then take the lowest
/// index.
pub(crate) fn place(c: &Costs, allowed: &[u32], capacity: &[u64]) -> Vec<u32> {
    let n = c.g.num_nodes();
    let nd = c.nd;
    let mut prev: Vec<Option<f64>> = vec![None; nd];
    let mut cur: Vec<Option<f64>> = vec![None; nd];
    // `[state * nd + d]`: resident bytes on `d` along the state's best path.
    let mut prev_used = vec![0.0f64; nd * nd];
    let mut cur_used = vec![0.0f64; nd * nd];
    let mut from = vec![u32::MAX; n * nd];
    let host_only = [HOST];
    for v in 0..n {
        let devs: &[u32] = if c.g.node_host_only()[v] {
            &host_only
        } else {
            allowed
        };
        cur.fill(None);
        for &d in devs {
            let du = d as usize;
            let k = v * nd + du;
            let bytes = if du == HOST as usize { 0.0 } else { c.bytes[v] };
            // (cost, predecessor, resident)
            let mut best: Option<(f64, usize, bool)> = None;
            let mut consider = |cost: f64, e: usize, resident: bool| {
                if best.is_none_or(|(b, _, _)| cost < b) {
                    best = Some((cost, e, resident));
                }
            };
            let charge = |used: f64, stay: bool| -> (f64, bool) {
                if bytes > 0.0 && used + bytes <= capacity[du] as f64 {
                    (0.0, true)
                } else if stay {
                    ((c.copy[k] - c.window[k]).max(0.0), false)
                } else {
                    (c.copy[k], false)
                }
            };
            if v == 0 {
                let (cost, resident) = charge(0.0, false);
                consider(cost, du, resident);
            } else {
                if let Some(p) = prev[du] {
                    let (cost, resident) = charge(prev_used[du * nd + du], true);
                    consider(p + cost, du, resident);
                }
                for (e, p) in prev.iter().enumerate() {
                    let Some(p) = p else { continue };
                    if e == du {
                        continue;
                    }
                    let (cost, resident) = charge(prev_used[e * nd + du], false);
                    consider(p + c.cut[v] * c.link[e * nd + du] + cost, e, resident);
                }
            }
            if let Some((cost, e, resident)) = best {
                cur[du] = Some(cost + c.time[k]);
                from[k] = e as u32;
                let row = &mut cur_used[du * nd..(du + 1) * nd];
                if v == 0 {
                    row.fill(0.0);
                } else {
                    row.copy_from_slice(&prev_used[e * nd..(e + 1) * nd]);
                }
                if resident {
                    row[du] += bytes;
                }
            }
        }
        std::mem::swap(&mut prev, &mut cur);
        std::mem::swap(&mut prev_used, &mut cur_used);
    }

    let mut node_device = vec![HOST; n];
    let mut last = None::<(f64, usize)>;
    for (d, p) in prev.iter().enumerate() {
        if let Some(p) = *p {
            if last.is_none_or(|(b, _)| p < b) {
                last = Some((p, d));
            }
        }
    }
    if let Some((_, mut d)) = last {
        for v in (0..n).rev() {
            node_device[v] = d as u32;
            d = from[v * nd + d] as usize;
        }
    }
    node_device
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(name: &str, is_host: bool, flops: f64, h2d: f64) -> Device {
        Device::new(name, is_host, flops, 1 << 40, h2d, h2d, 0.0)
    }

    /// x (host) -> `layers` layers of `flops` each with a `weight`-byte param.
    fn chain(layers: u32, flops: f64, weight: u64) -> CostGraph {
        let n = layers as usize + 1;
        let mut host_only = vec![false; n];
        host_only[0] = true;
        CostGraph::new(
            (0..n).map(|v| if v == 0 { 0.0 } else { flops }).collect(),
            vec![1000; n],
            host_only,
            std::iter::once(0).chain(0..=layers).collect(),
            (0..layers).collect(),
            vec![weight; layers as usize],
            (0..=layers).collect(),
            (1..=layers).collect(),
            vec![layers],
        )
        .unwrap()
    }

    const ROOMY: u64 = 1 << 40;

    #[test]
    fn room_everywhere_puts_everything_on_the_fastest_device() {
        let g = chain(4, 1e9, 1 << 20);
        let devices = [
            device("cpu", true, 1e9, 0.0),
            device("slow", false, 1e11, 1e9),
            device("fast", false, 1e12, 1e9),
        ];
        let c = Costs::new(&g, &devices, &[false; 4]);
        assert_eq!(place(&c, &[0, 1, 2], &[ROOMY; 3]), vec![0, 2, 2, 2, 2]);
    }

    #[test]
    fn costly_copies_keep_memory_bound_work_on_the_host() {
        // Each 1 MiB weight takes 1 s to copy but 1 ms to use on the host.
        let g = chain(4, 1e6, 1 << 20);
        let devices = [
            device("cpu", true, 1e9, 0.0),
            device("acc", false, 1e12, 1e6),
        ];
        let c = Costs::new(&g, &devices, &[false; 4]);
        assert_eq!(place(&c, &[0, 1], &[0, 0]), vec![0; 5]);
        // With room for every weight, the accelerator wins.
        assert_eq!(place(&c, &[0, 1], &[ROOMY; 2]), vec![0, 1, 1, 1, 1]);
        // Weights resident by decree cost nothing either.
        let c = Costs::new(&g, &devices, &[true; 4]);
        assert_eq!(place(&c, &[0, 1], &[0, 0]), vec![0, 1, 1, 1, 1]);
    }

    #[test]
    fn unequal_devices_get_unequal_shares() {
        // Twelve 1 MiB layers; the fast device holds eight, the slow four;
        // streaming is far too slow to pay.
        let g = chain(12, 1e9, 1 << 20);
        let devices = [
            device("cpu", true, 1e8, 0.0),
            device("fast", false, 2e12, 1e6),
            device("slow", false, 1e12, 1e6),
        ];
        let c = Costs::new(&g, &devices, &[false; 12]);
        let placed = place(&c, &[1, 2], &[0, 8 << 20, 4 << 20]);
        let on = |d: u32| placed.iter().filter(|&&x| x == d).count();
        assert_eq!((on(1), on(2)), (8, 4), "{placed:?}");
    }
}
