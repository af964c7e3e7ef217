//! The trip count of a `while` loop: the one XLA wrote into its backend config, else the
//! one its counted-loop pattern (induction variable, bound, step) gives.

use grpo_pjrt::hlo::{HloComputation, HloInstruction};
use std::collections::HashMap;

/// An instruction followed through copies, bitcasts and converts.
fn through<'b>(
    mut i: &'b HloInstruction,
    by_id: &HashMap<i64, &'b HloInstruction>,
) -> &'b HloInstruction {
    for _ in 0..16 {
        if matches!(
            i.opcode.as_str(),
            "copy" | "bitcast" | "convert" | "copy-done" | "copy-start" | "reshape"
        ) {
            match i.operand_ids.first().and_then(|o| by_id.get(o)) {
                Some(next) => i = next,
                None => break,
            }
        } else {
            break;
        }
    }
    i
}

/// The integer value of a `constant` instruction.
fn constant_of(i: &HloInstruction) -> Option<i64> {
    (i.opcode == "constant")
        .then(|| i.literal.as_ref().and_then(|l| l.first_integer()))
        .flatten()
}

/// The tuple index `i` reads from the computation's parameter, if it is such a read.
fn tuple_index_of(i: &HloInstruction, by_id: &HashMap<i64, &HloInstruction>) -> Option<i64> {
    let i = through(i, by_id);
    if i.opcode != "get-tuple-element" {
        return None;
    }
    let src = i.operand_ids.first().and_then(|o| by_id.get(o))?;
    (src.opcode == "parameter").then_some(i.tuple_index)
}

/// The trip count XLA itself derived and wrote into the while's backend config
/// (`{"known_trip_count":{"n":"152"}}`, XLA:GPU's `WhileLoopTripCountAnnotator`): its loops
/// are rewritten so that the pattern [`trip_count`] reads is gone from the condition.
pub(super) fn known_trip_count(w: &HloInstruction) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_slice(&w.backend_config).ok()?;
    let n = v.get("known_trip_count")?.get("n")?;
    n.as_u64().or_else(|| n.as_str()?.parse().ok())
}

/// Trip count of a counted loop: `cond` compares tuple element k with a constant, `body`
/// adds a constant step to element k, the initial tuple sets it to a constant.
pub(super) fn trip_count(
    w: &HloInstruction,
    outer: &HashMap<i64, &HloInstruction>,
    cond: &HloComputation,
    body: &HloComputation,
) -> Option<u64> {
    let cby: HashMap<i64, &HloInstruction> = cond.instructions.iter().map(|i| (i.id, i)).collect();
    let root = through(cby.get(&cond.root_id)?, &cby);
    if root.opcode != "compare" || root.operand_ids.len() != 2 {
        return None;
    }
    let a = cby.get(&root.operand_ids[0])?;
    let b = cby.get(&root.operand_ids[1])?;
    let (k, bound, dir) = match (
        tuple_index_of(a, &cby),
        constant_of(through(b, &cby)),
        tuple_index_of(b, &cby),
        constant_of(through(a, &cby)),
    ) {
        (Some(k), Some(c), _, _) => (k, c, root.comparison_direction.clone()),
        (_, _, Some(k), Some(c)) => {
            let flipped = match root.comparison_direction.as_str() {
                "LT" => "GT",
                "LE" => "GE",
                "GT" => "LT",
                "GE" => "LE",
                d => d,
            };
            (k, c, flipped.to_string())
        }
        _ => return None,
    };
    // Initial value: element k of the while's operand (a tuple).
    let init_tuple = through(outer.get(w.operand_ids.first()?)?, outer);
    if init_tuple.opcode != "tuple" {
        return None;
    }
    let init = constant_of(through(
        outer.get(init_tuple.operand_ids.get(k as usize)?)?,
        outer,
    ))?;
    // Step: element k of the body's root tuple is element k plus (or minus) a constant.
    let bby: HashMap<i64, &HloInstruction> = body.instructions.iter().map(|i| (i.id, i)).collect();
    let broot = bby.get(&body.root_id)?;
    if broot.opcode != "tuple" {
        return None;
    }
    let next = through(bby.get(broot.operand_ids.get(k as usize)?)?, &bby);
    if next.operand_ids.len() != 2 {
        return None;
    }
    let (x, y) = (
        bby.get(&next.operand_ids[0])?,
        bby.get(&next.operand_ids[1])?,
    );
    let step = match (
        tuple_index_of(x, &bby),
        constant_of(through(y, &bby)),
        tuple_index_of(y, &bby),
        constant_of(through(x, &bby)),
    ) {
        (Some(kx), Some(c), _, _) if kx == k => c,
        (_, _, Some(ky), Some(c)) if ky == k && next.opcode == "add" => c,
        _ => return None,
    };
    let step = match next.opcode.as_str() {
        "add" => step,
        "subtract" => -step,
        _ => return None,
    };
    let span = match (dir.as_str(), step.signum()) {
        ("LT", 1) => bound - init,
        ("LE", 1) => bound - init + 1,
        ("GT", -1) => init - bound,
        ("GE", -1) => init - bound + 1,
        ("NE", s) if s != 0 && (bound - init) % step == 0 => (bound - init) / step * step.signum(),
        _ => return None,
    };
    let step = step.abs();
    Some(if span <= 0 {
        0
    } else {
        ((span + step - 1) / step) as u64
    })
}
