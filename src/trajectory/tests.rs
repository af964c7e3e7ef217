use super::*;
use crate::cases::Case;

fn smoke_case(dtype: &str) -> Case {
    let m = crate::cases::load_dir(&crate::repo_root().join("cases")).unwrap();
    let id = format!("fused/{dtype}/b2_t8_v2049_h64/grpo/eps0.2-0.28/beta0.04/normal1-random-mixed");
    m.get(&id).unwrap_or_else(|| panic!("no case {id}")).clone()
}

#[test]
#[ignore = "measurement: prints series"]
fn print_series() {
    for dt in ["f32", "bf16"] {
        let case = smoke_case(dt);
        for spec in &case.trajectories {
            for bias in [0.0f32, SHOULD_FAIL_BIAS] {
                let mut imp = HostLogits { via: LogitsFn::Naive, bias };
                let rec = execute(&case, spec, &mut imp, "host", |_| {}).unwrap();
                println!("{dt} {} bias {bias}: {}", rec.label, rec.judgement.message);
                for p in rec.points.iter() {
                    println!("  {:2} L {:+.4e} {:+.4e} drift {:.3e} {:.3e} clip {:.2} moved {:.3e} flips {} {}", p.step, p.loss_exact, p.loss_implementation - p.loss_exact, p.drift_reference, p.drift_implementation, p.clipped_fraction, p.travelled, p.branch_flips, p.ambiguous_flips);
                }
            }
        }
    }
}

#[test]
#[ignore = "measurement: a grid of problem settings"]
fn grid() {
    for dt in ["f32", "bf16"] {
        let case = smoke_case(dt);
        let bias = if dt == "f32" { SHOULD_FAIL_BIAS } else { 4e-3 };
        for (opt, lrs) in [(Optimizer::Sgd, vec![0.03, 0.05, 0.08]), (Optimizer::Adam, vec![0.001, 0.002, 0.004])] {
            for init in [1.0, 0.3, 0.1] {
                for &lr in &lrs {
                    let spec = TrajectorySpec { suites: vec![], optimizer: opt, lr, steps: 20, num_iterations: 2, group_size: 2, init_std: init };
                    let h = execute(&case, &spec, &mut HostLogits { via: LogitsFn::Naive, bias: 0.0 }, "h", |_| {}).unwrap();
                    let b = execute(&case, &spec, &mut HostLogits { via: LogitsFn::Naive, bias }, "h", |_| {}).unwrap();
                    let clip: f64 = h.points.iter().filter(|p| p.step % 2 == 0).map(|p| p.clipped_fraction).sum::<f64>() / 10.0;
                    let l = h.points.last().unwrap();
                    let lb = b.points.last().unwrap();
                    println!("{dt} {} init {init} lr {lr}: clip {clip:.2} travelled {:.3e} env {:.3e} biased {:.3e} ratio {:.2} flips {}", opt.name(), l.travelled, l.drift_reference, lb.drift_implementation, lb.drift_implementation / l.drift_reference, h.points.iter().map(|p| p.ambiguous_flips).sum::<usize>());
                }
            }
        }
    }
}
