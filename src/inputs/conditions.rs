//! What a case's id promises of its inputs, checked on the inputs themselves: a
//! `right_pad` case has a padded position, a `zero_row` case an empty row, `mixed`
//! advantages both signs. A case whose name promises a condition its data lacks tests
//! nothing of it (a dr_grpo `right_pad_neginf` case once had no padded position).
//!
//! Only the cheap inputs are generated (the mask and the advantages: each has its own
//! stream), so every case of every tier is checked in milliseconds. Conditions the
//! generator places by construction (the ratio profiles' targets, the hostile values at
//! masked positions) follow from these: a hostile mask with no masked position is caught
//! here.

use super::{advantages_of, completion_mask};
use crate::cases::{AdvPattern, Case, MaskPattern};

/// Each condition the id of `case` names that its inputs lack, in words (empty: every
/// named condition holds).
pub fn missing(case: &Case) -> Vec<String> {
    let s = case.shape;
    let mask = completion_mask(case);
    let rows: Vec<&[f32]> = mask.chunks(s.t).collect();
    let live = |r: &[f32]| r.iter().any(|&m| m != 0.0);
    let mut out = Vec::new();
    let mut need = |ok: bool, what: &str| {
        if !ok {
            out.push(format!("mask `{}`: {what}", case.mask.name()));
        }
    };
    match case.mask {
        MaskPattern::All => need(mask.iter().all(|&m| m == 1.0), "a masked position"),
        MaskPattern::Random => need(
            mask.contains(&0.0) && mask.contains(&1.0),
            "no masked position, or no live one",
        ),
        MaskPattern::RandomHostile => need(
            mask.contains(&0.0),
            "no masked position to hold the hostile values",
        ),
        MaskPattern::ZeroRow => need(rows.iter().any(|r| !live(r)), "no empty row"),
        // Padding before a live token of the same row.
        MaskPattern::LeftPad => need(
            rows.iter()
                .any(|r| r[0] == 0.0 && r.iter().any(|&m| m != 0.0)),
            "no row padded at its start before a live token",
        ),
        // A live token, then padding to the row's end.
        MaskPattern::RightPad | MaskPattern::RightPadNeginf => need(
            rows.iter()
                .any(|r| r[s.t - 1] == 0.0 && r.iter().any(|&m| m != 0.0)),
            "no row padded at its end after a live token",
        ),
    }
    let adv = advantages_of(case);
    let (neg, pos) = (adv.iter().any(|&a| a < 0.0), adv.iter().any(|&a| a > 0.0));
    let holds = match case.advantages {
        // One sequence has one sign: B = 1 promises none.
        AdvPattern::Mixed => s.b < 2 || (neg && pos),
        AdvPattern::Zero => !neg && !pos,
        AdvPattern::Positive => !neg && pos,
        AdvPattern::Negative => neg && !pos,
    };
    if !holds {
        out.push(format!(
            "advantages `{}`: they are {adv:?}",
            case.advantages.name()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cases::{load_dir, parse_fixed};

    /// Every case of every tier has what its id names (the mask's padding or empty row,
    /// the advantages' signs).
    #[test]
    fn every_case_has_the_conditions_its_name_promises() {
        let m = load_dir(&crate::repo_root().join("cases")).unwrap();
        let mut gaps = Vec::new();
        let mut n = 0;
        for case in &m.cases {
            n += 1;
            for g in missing(case) {
                gaps.push(format!("{}: {g}", case.id));
            }
        }
        assert!(n > 200, "only {n} cases checked");
        assert!(
            gaps.is_empty(),
            "{} case(s):\n{}",
            gaps.len(),
            gaps.join("\n")
        );
    }

    /// The check can fail: a case with a mask too short to pad says so.
    #[test]
    fn a_case_without_its_named_condition_is_named() {
        let c = parse_fixed("b: 1, t: 1, v: 300, mask: right_pad").unwrap();
        let gaps = missing(&c);
        assert!(gaps[0].contains("no row padded at its end"), "{gaps:?}");
    }
}
