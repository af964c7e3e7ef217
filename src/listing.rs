//! What a listing knows of each trial without opening a backend (the test harness's
//! `--list`, which cargo-nextest calls before it starts a process per test): which
//! trials are not applicable (not listed), which are known to be ignored (listed under
//! `--ignored`), and which would run.

use crate::config::Config;
use crate::runner::Verdict;
use crate::trials::{Trial, Work, COMPILE_ONLY};
use std::collections::HashMap;

/// The levels each implementation id of the suite's exporter has (`--list-impls`); an id
/// it does not name (an external `module:attribute` entry) is taken as applicable.
pub type Levels = HashMap<String, Vec<String>>;

/// The listing's verdict on `t`: [`Verdict::NotApplicable`] when its implementation
/// lacks the case's level, [`Verdict::Ignored`] for a compile-only case on an executing
/// backend or a device backend on a machine without the device, None when it would run.
pub fn verdict(t: &Trial, levels: &Levels, config: &Config) -> Option<Verdict> {
    let (backend, implementation, case) = match &t.work {
        Work::Run {
            implementation,
            case,
            ..
        }
        | Work::Trajectory {
            implementation,
            case,
            ..
        } => (t.key.0.as_str(), implementation, case),
        _ => return None,
    };
    let id = config
        .backends
        .implementations_on(backend)
        .into_iter()
        .find(|c| c.display_name() == implementation)
        .map(|c| c.id);
    if let Some(have) = id.as_ref().and_then(|id| levels.get(id)) {
        let level = match case.level {
            crate::spec::Level::Logits => "logits",
            crate::spec::Level::Fused => "fused",
        };
        if !have.iter().any(|l| l == level) {
            return Some(Verdict::NotApplicable(format!(
                "{implementation}: not applicable: level '{level}'"
            )));
        }
    }
    let executes = !backend.starts_with("tpu-aot");
    if executes && case.compile_only && matches!(t.work, Work::Run { .. }) {
        return Some(Verdict::Ignored(COMPILE_ONLY.into()));
    }
    no_device(backend).map(|why| Verdict::Ignored(format!("backend unavailable: {why}")))
}

/// Why this machine lacks the device of `backend` (pjrt-gpu, pjrt-tpu), if it does.
fn no_device(backend: &str) -> Option<String> {
    #[cfg(feature = "pjrt")]
    {
        use crate::backends::pjrt::profile::Profile;
        match backend {
            "pjrt-gpu" => Profile::Gpu.unavailable_reason(),
            "pjrt-tpu" => Profile::Tpu.unavailable_reason(),
            _ => None,
        }
    }
    #[cfg(not(feature = "pjrt"))]
    {
        let _ = backend;
        None
    }
}

/// The levels of the suite's exporter's implementations, from its registry (one Python
/// start, no backend opened); empty when the build has no exporter.
pub fn exporter_levels() -> anyhow::Result<Levels> {
    #[cfg(feature = "pjrt")]
    {
        let e = crate::backends::pjrt::export::Exporter::new("cpu", None)?;
        Ok(e.list_impls()?
            .into_iter()
            .map(|i| (i.id, i.capabilities.levels))
            .collect())
    }
    #[cfg(not(feature = "pjrt"))]
    Ok(Levels::new())
}

/// The backends a trial name needs opened: a name's first segment (the second after
/// `trajectory/`) when it is one of `backends`; none for golden and should-fail trials.
pub fn backend_of<'a>(name: &str, backends: &'a [String]) -> Option<&'a String> {
    let rest = name.strip_prefix("trajectory/").unwrap_or(name);
    let first = rest.split('/').next()?;
    backends.iter().find(|b| b.as_str() == first)
}
