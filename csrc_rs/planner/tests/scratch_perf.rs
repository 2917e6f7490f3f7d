mod common;
use common::*;
use std::time::Instant;
use tensortorrent_planner::{plan, Objective};

#[test]
fn perf_varied() {
    let mut rng = Rng::new(7);
    for trial in 0..4 {
        let mut b = Builder::default();
        let mut prev = b.input(64 * KIB);
        let mut skip = prev;
        let mut total = 0;
        for i in 0..5000 {
            let act = (1 + rng.below(64)) * KIB * if rng.chance(5) { 64 } else { 1 };
            let lin = if i % 7 == 3 { b.node(1e8 * (1 + rng.below(10)) as f64, act, false, &[prev, skip]) } else { b.node(1e8 * (1 + rng.below(10)) as f64, act, false, &[prev]) };
            let w = (1 + rng.below(8)) * MIB / 4;
            total += w;
            b.param(w, &[lin]);
            if rng.chance(2) { b.param(w, &[lin, (lin + 50).min(9000)]); }
            if i % 7 == 0 { skip = lin; }
            prev = b.node(1e6, act, false, &[lin]);
        }
        b.output(prev);
        let g = b.build();
        for frac in [0.3, 0.6, 0.9] {
            let budget = (total as f64 * frac) as u64;
            let t = Instant::now();
            let p = plan(&g, &machine(budget), Objective::Latency, false);
            eprintln!("TIMING trial {trial} frac {frac}: {:.3}s ok={}", t.elapsed().as_secs_f64(), p.is_ok());
        }
    }
}
