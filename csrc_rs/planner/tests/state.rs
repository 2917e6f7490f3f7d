//! State: graph inputs written in place (a static KV cache), placed by the
//! planner. Held where they live for the whole call, their new values go back
//! there (no copy when made there), and an in-place update allocates nothing
//! where its state is.

mod common;

use common::{accelerator, host, Builder, KIB};
use tensortorrent_planner::{plan, simulate, CostGraph, Objective, PlanError};

const CACHE: u64 = 64 * KIB;

/// `cache` (movable or not) -> `update` (the cache's new value, an output) ->
/// `attention` reading it -> `out`.
fn decode(movable: bool, in_place: bool) -> CostGraph {
    let mut b = Builder::default();
    let x = b.input(KIB);
    let cache = b.node(0.0, CACHE, !movable, &[]);
    let update = b.node(1e3, CACHE, false, &[cache, x]);
    let attention = b.node(1e6, KIB, false, &[update, x]);
    b.output(update);
    b.output(attention);
    b.build()
        .with_state(&[(cache, update, in_place)])
        .expect("a valid state pair")
}

fn devices() -> Vec<tensortorrent_planner::Device> {
    vec![host(1 << 30), accelerator("virtual:0", 1 << 30)]
}

#[test]
fn state_on_the_device_costs_no_copy_and_its_update_no_memory_when_in_place() {
    let place = [0, 1, 1, 1];
    let functional = simulate(&decode(true, false), &devices(), &place, &[], 1).unwrap();
    let in_place = simulate(&decode(true, true), &devices(), &place, &[], 1).unwrap();
    // the input x is copied in (1 KiB) and the attention's output back (1 KiB): the
    // cache and its new value are not copied either way
    let link: f64 = in_place
        .busy_s
        .iter()
        .filter(|(r, _)| !matches!(r, tensortorrent_planner::Resource::Compute(_)))
        .map(|(_, s)| s)
        .sum();
    assert!(link < 3.0 * KIB as f64 / 1e10, "link busy {link} s");
    // functional: the cache and its new value both live on the device
    assert!(functional.peak_bytes[1] >= 2 * CACHE);
    // in place: the cache once
    assert!(in_place.peak_bytes[1] >= CACHE && in_place.peak_bytes[1] < CACHE + 4 * KIB);
}

#[test]
fn state_in_host_memory_is_copied_to_the_device_and_back_each_call() {
    // the cache stays on the host (not movable), the update and attention run on the
    // accelerator: the cache goes over the link, and its new value comes back
    let g = decode(false, false);
    let on_device = simulate(&g, &devices(), &[0, 0, 1, 1], &[], 1).unwrap();
    let link: f64 = on_device
        .busy_s
        .iter()
        .filter(|(r, _)| !matches!(r, tensortorrent_planner::Resource::Compute(_)))
        .map(|(_, s)| s)
        .sum();
    assert!(link >= 2.0 * CACHE as f64 / 1e10, "link busy {link} s");
}

#[test]
fn a_movable_state_updated_in_place_lives_where_its_update_runs() {
    let g = decode(true, true);
    let plan = plan(&g, &devices(), Objective::Latency, true).unwrap();
    assert_eq!(
        plan.node_device[1], plan.node_device[2],
        "{:?}",
        plan.node_device
    );
}

#[test]
fn state_pairs_are_validated() {
    let mut builder = Builder::default();
    let input = builder.input(KIB);
    let output = builder.node(1.0, KIB, false, &[input]);
    builder.output(output);
    let graph = builder.build();
    let not_an_input = graph
        .clone()
        .with_state(&[(output, output, false)])
        .unwrap_err();
    assert!(
        matches!(not_an_input, PlanError::InvalidGraph(message) if message.contains("not a graph input"))
    );
    let not_an_output = graph
        .clone()
        .with_state(&[(input, input, false)])
        .unwrap_err();
    assert!(matches!(not_an_output, PlanError::InvalidGraph(_)));
    let twice = graph
        .with_state(&[(input, output, false), (input, output, true)])
        .unwrap_err();
    assert!(
        matches!(twice, PlanError::InvalidGraph(message) if message.contains("two state inputs"))
    );
}
