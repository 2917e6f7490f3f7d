//! Local search: hill climbing on simulated placements, restarted from
//! every candidate and then from kicks of the best.
//!
//! From a starting placement, the moves below are tried in a fixed order.
//! On graphs of up to `PAIR_MOVES_MAX` nodes a scan tries them all and takes
//! the best (steepest descent: a cheap fix of one budget does not block a
//! better one); on larger graphs it takes the first better one and the next
//! scan goes on from the move after it. A climb ends when a whole scan
//! finds nothing better. Once every start has been climbed, the best
//! placement is kicked (two or three random moves, from a generator with a
//! fixed seed, so the search stays deterministic) and climbed again, until
//! `KICKS_WITHOUT_GAIN` kicks in a row bring nothing or the budgets run
//! out. The moves:
//! * every node of one device to another device, or two devices trading
//!   all their nodes;
//! * a stretch (a maximal run of consecutive movable nodes on one device)
//!   to another device, its parameters keeping their flags, or all
//!   streamed, or all resident;
//! * one parameter streamed instead of resident, or the reverse;
//! * one node of a longer stretch to another device (graphs of up to
//!   `NODE_MOVES_MAX` nodes only);
//! * two nodes at once, each to another device (graphs of up to
//!   `PAIR_MOVES_MAX` nodes only): what one move at a time cannot reach
//!   when each half alone is worse, such as two nodes trading devices.

use crate::graph::CostGraph;
use crate::placement::{streamable, Placement};
use crate::plan::objective::Score;
use crate::plan::search::{Search, Trial};

/// Largest graph whose single nodes are moved one by one.
const NODE_MOVES_MAX: usize = 4096;
/// Largest graph whose nodes are also moved two at a time.
const PAIR_MOVES_MAX: usize = 24;
/// Kicks in a row without a better placement that end the search.
const KICKS_WITHOUT_GAIN: usize = 32;
/// Seed of the kicks' generator.
const KICK_SEED: u64 = 0x9e37_79b9_7f4a_7c15;

#[derive(Debug, Clone, Copy)]
enum Move {
    Stretch {
        first: usize,
        last: usize,
        to: u32,
        streamed: Option<bool>,
    },
    Merge(u32, u32),
    Trade(u32, u32),
    Flip(usize),
    Node(usize, u32),
    Pair(usize, u32, usize, u32),
}

/// The stretches of a placement: maximal runs of consecutive movable
/// nodes on one device, as (first, last, device).
fn stretches(g: &CostGraph, node_device: &[u32]) -> Vec<(usize, usize, u32)> {
    let movable = |v: usize| !g.node_host_only()[v];
    let mut out = Vec::new();
    let mut first = 0;
    while first < g.num_nodes() {
        if !movable(first) {
            first += 1;
            continue;
        }
        let device = node_device[first];
        let mut last = first;
        while last + 1 < g.num_nodes() && movable(last + 1) && node_device[last + 1] == device {
            last += 1;
        }
        out.push((first, last, device));
        first = last + 1;
    }
    out
}

/// The moves from a placement, in the order they are tried.
fn moves(search: &Search, node_device: &[u32]) -> Vec<Move> {
    let g = search.g;
    let n = g.num_nodes();
    let movable = search.movable_devices();
    let stretches = stretches(g, node_device);
    let mut used = vec![false; search.devices.len()];
    for &(_, _, d) in &stretches {
        used[d as usize] = true;
    }
    let mut out = Vec::new();
    for &from in movable.iter().filter(|&&d| used[d as usize]) {
        for &to in movable.iter().filter(|&&d| d != from) {
            out.push(Move::Merge(from, to));
            if to > from && used[to as usize] {
                out.push(Move::Trade(from, to));
            }
        }
    }
    for &(first, last, d) in &stretches {
        let reads = (first..=last).any(|u| !g.node_params(u).is_empty());
        for &to in &movable {
            if to == d {
                continue;
            }
            out.push(Move::Stretch {
                first,
                last,
                to,
                streamed: None,
            });
            if reads {
                for flag in [true, false] {
                    out.push(Move::Stretch {
                        first,
                        last,
                        to,
                        streamed: Some(flag),
                    });
                }
            }
        }
    }
    out.extend(
        (0..g.num_params())
            .filter(|&q| streamable(g, node_device, q))
            .map(Move::Flip),
    );
    if n <= NODE_MOVES_MAX {
        for &(first, last, d) in &stretches {
            if first == last {
                continue;
            }
            for u in first..=last {
                out.extend(
                    movable
                        .iter()
                        .filter(|&&to| to != d)
                        .map(|&to| Move::Node(u, to)),
                );
            }
        }
    }
    if n <= PAIR_MOVES_MAX {
        let free: Vec<usize> = (0..n).filter(|&v| !g.node_host_only()[v]).collect();
        for (i, &u) in free.iter().enumerate() {
            for &v in &free[i + 1..] {
                for &du in movable.iter().filter(|&&d| d != node_device[u]) {
                    for &dv in movable.iter().filter(|&&d| d != node_device[v]) {
                        out.push(Move::Pair(u, du, v, dv));
                    }
                }
            }
        }
    }
    out
}

fn apply(s: &Search, m: Move, node_device: &mut [u32], streamed: &mut [bool]) {
    let movable = |v: usize| !s.g.node_host_only()[v];
    match m {
        Move::Merge(from, to) => {
            for (v, d) in node_device.iter_mut().enumerate() {
                if *d == from && movable(v) {
                    *d = to;
                }
            }
        }
        Move::Trade(a, b) => {
            for (v, d) in node_device.iter_mut().enumerate() {
                if movable(v) {
                    if *d == a {
                        *d = b;
                    } else if *d == b {
                        *d = a;
                    }
                }
            }
        }
        Move::Stretch {
            first,
            last,
            to,
            streamed: flag,
        } => {
            node_device[first..=last].fill(to);
            if let Some(flag) = flag {
                for v in first..=last {
                    for &q in s.g.node_params(v) {
                        streamed[q as usize] = flag;
                    }
                }
            }
        }
        Move::Flip(q) => streamed[q] = !streamed[q],
        Move::Node(v, to) => node_device[v] = to,
        Move::Pair(u, du, v, dv) => {
            node_device[u] = du;
            node_device[v] = dv;
        }
    }
}

/// A small, fast generator (`SplitMix64`) for the kicks.
struct SplitMix(u64);

impl SplitMix {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % n as u64) as usize
    }
}

/// `base` after two or three moves drawn at random from those of each
/// step.
fn kick(s: &Search, base: &Placement, rng: &mut SplitMix) -> Placement {
    let mut node_device = base.node_device.clone();
    let mut streamed = base.param_streamed.clone();
    for _ in 0..2 + rng.below(2) {
        let list = moves(s, &node_device);
        if list.is_empty() {
            break;
        }
        apply(
            s,
            list[rng.below(list.len())],
            &mut node_device,
            &mut streamed,
        );
    }
    Placement::new(s.g, node_device, streamed)
}

/// Climbs from each start (best first, with its score), then from kicks of
/// the best placement; returns the best placement found when it beats the
/// best start.
pub(crate) fn search(
    s: &mut Search,
    starts: &[(Placement, Score)],
    score: &dyn Fn(&Search, &Trial) -> Score,
) -> Option<Trial> {
    let (first, first_score) = starts.first()?;
    let mut best: Option<Trial> = None;
    let mut best_score = *first_score;
    for (start, start_score) in starts {
        if s.out_of_budget() {
            return best;
        }
        if let Some(t) = improve(s, start, *start_score, score) {
            let sc = score(s, &t);
            if sc.better_than(&best_score) {
                (best, best_score) = (Some(t), sc);
            }
        }
    }
    let mut rng = SplitMix(KICK_SEED);
    let mut fails = 0;
    while fails < KICKS_WITHOUT_GAIN && !s.out_of_budget() {
        let base = best.as_ref().map_or(first, |t| &t.placement);
        let kicked = kick(s, base, &mut rng);
        let trial = s.simulate(kicked.clone());
        let kicked_score = score(s, &trial);
        let (sc, t) = match improve(s, &kicked, kicked_score, score) {
            Some(t) => (score(s, &t), t),
            None => (kicked_score, trial),
        };
        if sc.better_than(&best_score) {
            (best, best_score) = (Some(t), sc);
            fails = 0;
        } else {
            fails += 1;
        }
    }
    best
}

/// The move a scan takes, with what it leads to.
struct Step {
    index: usize,
    node_device: Vec<u32>,
    streamed: Vec<bool>,
    trial: Trial,
    score: Score,
}

/// Hill-climbs from `start` (whose score is `start_score`) under
/// `score`; returns the best placement found when it beats the start.
/// Graphs of up to `PAIR_MOVES_MAX` nodes take the best move of each scan
/// (steepest descent: a cheap fix of one budget does not block a better
/// one), larger graphs the first better move.
fn improve(
    s: &mut Search,
    start: &Placement,
    start_score: Score,
    score: &dyn Fn(&Search, &Trial) -> Score,
) -> Option<Trial> {
    let steepest = s.g.num_nodes() <= PAIR_MOVES_MAX;
    let mut node_device = start.node_device.clone();
    // The wished flags survive moves that make them meaningless for a while.
    let mut streamed = start.param_streamed.clone();
    let mut best_score = start_score;
    let mut best = None;
    let mut cursor = 0;
    loop {
        let list = moves(s, &node_device);
        let mut taken: Option<Step> = None;
        for offset in 0..list.len() {
            if s.out_of_budget() {
                break;
            }
            let index = (cursor + offset) % list.len();
            let (mut nd, mut st) = (node_device.clone(), streamed.clone());
            apply(s, list[index], &mut nd, &mut st);
            let trial = s.simulate(Placement::new(s.g, nd.clone(), st.clone()));
            let sc = score(s, &trial);
            let bar = taken.as_ref().map_or(&best_score, |t| &t.score);
            if sc.better_than(bar) {
                taken = Some(Step {
                    index,
                    node_device: nd,
                    streamed: st,
                    trial,
                    score: sc,
                });
                if !steepest {
                    break;
                }
            }
        }
        let Some(step) = taken else {
            return best;
        };
        (node_device, streamed, best_score, cursor) =
            (step.node_device, step.streamed, step.score, step.index);
        best = Some(step.trial);
    }
}
