//! A case from its id alone: the inverse of [`Case::make_id`], so any valid case, in the
//! matrix or not, can be named on the command line (`run --case`, `cases --explain`,
//! `shrink`'s minimal cases).

use super::{parse_fixed, Case};

/// The case an id names (tier `standard`, not compile-only, no trajectories: what the id
/// does not say), or one line saying what is wrong with the id and where.
///
/// ```
/// let id = "fused/bf16-inputlogits/b2_t8_v2049_h64/dr_grpo-L16-seq/eps0.2-0.28/beta0.04_tau0.7_delta2/policy-right_pad-mixed";
/// let c = grpo_conformance::cases::parse_id(id).unwrap();
/// assert_eq!((c.shape.b, c.shape.v, c.shape.h), (2, 2049, Some(64)));
/// assert_eq!(c.id, id);
/// assert!(grpo_conformance::cases::parse_id("logits/f32/b2_t8/grpo").is_err());
/// ```
pub fn parse_id(id: &str) -> Result<Case, String> {
    let bad = |what: &str| format!("case id `{id}`: {what}");
    let segs: Vec<&str> = id.split('/').collect();
    if segs.len() != 7 && segs.len() != 8 {
        return Err(bad(&format!(
            "{} segments, expected 7 (level/dtype/shape/loss/eps/knobs/data) or 8 (…/d<devices>-<sharding>), e.g. logits/f32/b2_t8_v2049/grpo/eps0.2-0.28/beta0.04/normal1-random-mixed",
            segs.len()
        )));
    }
    let mut fixed: Vec<String> = Vec::new();
    let mut kv = |k: &str, v: &str| fixed.push(format!("{k}: {v}"));
    match segs[0] {
        "logits" | "fused" => kv("level", segs[0]),
        l => {
            return Err(bad(&format!(
                "level `{l}` (segment 1), expected logits or fused"
            )))
        }
    }
    match segs[1].strip_suffix("-inputlogits") {
        Some(d) => {
            kv("dtype", d);
            kv("logits_dtype", "input");
        }
        None => kv("dtype", segs[1]),
    }
    let dtype = segs[1].strip_suffix("-inputlogits").unwrap_or(segs[1]);
    if !["f32", "bf16", "f16"].contains(&dtype) {
        return Err(bad(&format!(
            "dtype `{dtype}` (segment 2), expected f32, bf16 or f16"
        )));
    }
    let loss_type = segs[3].split('-').next().unwrap_or_default();
    if !["grpo", "bnpo", "dr_grpo"].contains(&loss_type) {
        return Err(bad(&format!(
            "loss type `{loss_type}` (segment 4), expected grpo, bnpo or dr_grpo"
        )));
    }
    let mut seen = String::new();
    for part in segs[2].split('_') {
        let (k, n) = part.split_at(part.len().min(1));
        if !matches!(k, "b" | "t" | "v" | "h") || n.parse::<usize>().is_err() {
            return Err(bad(&format!(
                "shape `{}` (segment 3): `{part}` is not b<N>, t<N>, v<N> or h<N>",
                segs[2]
            )));
        }
        seen.push_str(k);
        kv(k, n);
    }
    if seen != "btv" && seen != "btvh" {
        return Err(bad(&format!(
            "shape `{}` (segment 3), expected b<B>_t<T>_v<V>, with _h<H> at the fused level",
            segs[2]
        )));
    }
    let mut loss = segs[3].split('-');
    kv("loss_type", loss.next().unwrap_or_default());
    for extra in loss {
        match extra {
            "seq" => kv("importance_sampling_level", "sequence"),
            l if l.starts_with('L') && l[1..].parse::<usize>().is_ok() => {
                kv("max_completion_length", &l[1..])
            }
            _ => {
                return Err(bad(&format!(
                    "loss `{}` (segment 4): `{extra}` is neither L<max_completion_length> nor seq",
                    segs[3]
                )))
            }
        }
    }
    match segs[4].strip_prefix("eps").and_then(|e| e.split_once('-')) {
        Some((lo, hi)) => {
            kv("epsilon_low", lo);
            kv("epsilon_high", hi);
        }
        None => {
            return Err(bad(&format!(
                "`{}` (segment 5), expected eps<low>-<high>",
                segs[4]
            )))
        }
    }
    for (i, knob) in segs[5].split('_').enumerate() {
        let known = [("beta", "beta"), ("tau", "temperature"), ("delta", "delta")];
        match known.iter().find(|(p, _)| knob.starts_with(p)) {
            Some((p, key)) if (i == 0) == (*p == "beta") => kv(key, &knob[p.len()..]),
            _ => {
                return Err(bad(&format!(
                    "knobs `{}` (segment 6), expected beta<β>[_tau<τ>][_delta<δ>]",
                    segs[5]
                )))
            }
        }
    }
    let data: Vec<&str> = segs[6].split('-').collect();
    if data.len() != 3 {
        return Err(bad(&format!(
            "data `{}` (segment 7), expected <profile>-<mask>-<advantages>, e.g. normal1-random-mixed",
            segs[6]
        )));
    }
    use std::str::FromStr;
    let named = |seg: usize, what: &str, r: Result<(), String>| {
        r.map_err(|e| bad(&format!("{e} (segment {seg}, {what})")))
    };
    named(
        7,
        "profile",
        super::DataProfile::from_str(data[0]).map(drop),
    )?;
    named(7, "mask", super::MaskPattern::from_str(data[1]).map(drop))?;
    named(
        7,
        "advantages",
        super::AdvPattern::from_str(data[2]).map(drop),
    )?;
    kv("profile", data[0]);
    kv("mask", data[1]);
    kv("advantages", data[2]);
    if let Some(d) = segs.get(7) {
        match d.strip_prefix('d').and_then(|d| d.split_once('-')) {
            Some((n, sh)) => {
                named(8, "sharding", super::Sharding::from_str(sh).map(drop))?;
                kv("devices", n);
                kv("sharding", sh);
            }
            None => {
                return Err(bad(&format!(
                    "`{d}` (segment 8), expected d<devices>-<batch|vocab>"
                )))
            }
        }
    }
    let case = parse_fixed(&fixed.join(", ")).map_err(|e| {
        // The loader's message names its own synthetic group; what matters follows the id.
        let msg = format!("{e:#}").replace('\n', " ");
        let tail = msg.rsplit_once(&format!("{id}: ")).map(|x| x.1.to_string());
        bad(&tail.unwrap_or(msg))
    })?;
    if case.id != id {
        return Err(bad(&format!(
            "not written as the suite writes it; the case it describes is `{}`",
            case.id
        )));
    }
    Ok(case)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_of_the_matrix_is_its_own_id() {
        let m = crate::cases::load_dir(&crate::repo_root().join("cases")).unwrap();
        assert!(m.cases.len() > 100);
        for c in &m.cases {
            let p = parse_id(&c.id).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(p.id, c.id);
            assert_eq!(
                (p.level, p.shape, p.dtype),
                (c.level, c.shape, c.dtype),
                "{}",
                c.id
            );
            assert_eq!(p.knobs, c.knobs, "{}", c.id);
            assert_eq!(
                (p.profile, p.mask, p.advantages),
                (c.profile, c.mask, c.advantages),
                "{}",
                c.id
            );
            assert_eq!((p.devices, p.sharding), (c.devices, c.sharding), "{}", c.id);
        }
    }

    #[test]
    fn a_bad_id_is_one_line_naming_the_part() {
        let e = |id: &str| parse_id(id).unwrap_err();
        assert!(
            e("logits/f32/b2_t8_v0/grpo/eps0.2-0.2/beta0/normal1-random-mixed")
                .contains("case id `logits/f32/b2_t8_v0/")
        );
        assert!(
            e("logits/f32/b2_x8_v9/grpo/eps0.2-0.2/beta0/normal1-random-mixed")
                .contains("`x8` is not b<N>")
        );
        assert!(
            e("logits/f32/b2_t8_v9/grpo/eps0.2-0.2/tau1_beta0/normal1-random-mixed")
                .contains("segment 6")
        );
        assert!(
            e("logits/f32/b2_t8_v9/grpo/eps0.2-0.2/beta0/normal1-random").contains("segment 7")
        );
        assert!(
            e("logits/f32/b2_t8_v9/grpo/eps0.2-0.2/beta0/nosuch-random-mixed")
                .contains("unknown profile `nosuch`")
        );
        // tau1 is the default: the suite writes no _tau1.
        assert!(e("logits/f32/b2_t8_v9/grpo/eps0.2-0.2/beta0_tau1/normal1-random-mixed")
            .contains("the case it describes is `logits/f32/b2_t8_v9/grpo/eps0.2-0.2/beta0/normal1-random-mixed`"));
        for id in [
            "a/b",
            "logits/f32/b2_t8_v9/grpo/eps0.2-0.2/beta0/normal1-random-mixed/x",
        ] {
            assert!(!e(id).contains('\n'), "{}", e(id));
        }
    }
}
