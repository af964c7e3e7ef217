//! The memory budget: a compiled peak against `max_peak_over_floor` × floor + slack.

use crate::backends::{Budget, Memory};
use serde::{Deserialize, Serialize};

/// The memory budget of a trial: compiled peak against `max_peak_over_floor` × floor +
/// `slack_bytes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetReport {
    /// The configured bound on peak / floor.
    pub max_peak_over_floor: f64,
    /// The configured fixed allowance, bytes.
    pub slack_bytes: u64,
    /// Compiled peak, bytes.
    pub peak_bytes: u64,
    /// Arguments + outputs − aliased, bytes.
    pub floor_bytes: u64,
    /// peak / floor.
    pub ratio: f64,
    /// peak ≤ max_peak_over_floor × floor + slack_bytes.
    pub passed: bool,
    /// One line: peak, floor, ratio, budget.
    pub message: String,
}

impl BudgetReport {
    /// Judges `memory` against `budget`; an error when the figures are missing.
    pub fn judge(b: Budget, memory: Option<&Memory>) -> Result<BudgetReport, String> {
        let budget = b.max_peak_over_floor;
        let m = memory
            .ok_or("a memory budget is configured but the backend reported no memory figures")?;
        let (Some(peak), Some(floor)) = (m.peak_bytes, m.floor_bytes) else {
            return Err(
                "a memory budget is configured but the compiler reported no peak or no floor"
                    .into(),
            );
        };
        if floor == 0 {
            return Err("floor (arguments + outputs − aliased) is 0 bytes".into());
        }
        let ratio = peak as f64 / floor as f64;
        let bound = budget * floor as f64 + b.slack_bytes as f64;
        let passed = peak as f64 <= bound;
        let slack = if b.slack_bytes > 0 {
            format!(" + {}", human_bytes(b.slack_bytes))
        } else {
            String::new()
        };
        let message =
            format!(
            "memory: peak {} / floor {} = {ratio:.3}×; budget {budget}× floor{slack} = {}: {}{}",
            human_bytes(peak),
            human_bytes(floor),
            human_bytes(bound as u64),
            if passed { "within" } else { "OVER BUDGET" },
            m.source.as_ref().map(|s| format!(" ({s})")).unwrap_or_default()
        );
        Ok(BudgetReport {
            max_peak_over_floor: budget,
            slack_bytes: b.slack_bytes,
            peak_bytes: peak,
            floor_bytes: floor,
            ratio,
            passed,
            message,
        })
    }
}

/// Bytes for people: `2.489 GB`, `1.21 MB`, `812 B` (decimal units, as the issues and
/// notes quote compiler figures).
pub fn human_bytes(b: u64) -> String {
    let x = b as f64;
    if x >= 1e9 {
        format!("{:.3} GB", x / 1e9)
    } else if x >= 1e6 {
        format!("{:.3} MB", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.2} kB", x / 1e3)
    } else {
        format!("{b} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem(peak: u64, arg: u64, out: u64) -> Memory {
        Memory {
            peak_bytes: Some(peak),
            argument_bytes: Some(arg),
            output_bytes: Some(out),
            alias_bytes: Some(0),
            ..Default::default()
        }
        .with_floor()
    }

    #[test]
    fn budget_passes_at_and_fails_above_the_bound() {
        let b = |r, s| Budget {
            max_peak_over_floor: r,
            slack_bytes: s,
        };
        let r = BudgetReport::judge(b(1.05, 0), Some(&mem(105, 60, 40))).unwrap();
        assert!(r.passed && (r.ratio - 1.05).abs() < 1e-12, "{r:?}");
        let r = BudgetReport::judge(b(1.05, 0), Some(&mem(200, 60, 40))).unwrap();
        assert!(
            !r.passed && r.message.contains("2.000×") && r.message.contains("OVER BUDGET"),
            "{}",
            r.message
        );
        // The slack is absolute: it admits a fixed overhead, not a proportional one.
        assert!(
            BudgetReport::judge(b(1.05, 50), Some(&mem(155, 60, 40)))
                .unwrap()
                .passed
        );
        assert!(
            !BudgetReport::judge(b(1.05, 50), Some(&mem(156, 60, 40)))
                .unwrap()
                .passed
        );
        assert!(BudgetReport::judge(b(1.05, 0), None).is_err());
        assert!(BudgetReport::judge(b(1.05, 0), Some(&Memory::default())).is_err());
    }
}
