//! How the f32 loops evaluate the loss at their parameters: an implementation's exported
//! SPEC function through its backend (fused level), or the host's f32 product
//! hidden·lm_head fed to a logits-level function (`naive_f32`, the plain-f32 reference,
//! or a logits-level implementation through its backend) with the LM-head gradient
//! taken on the host in f32.

use crate::backends::{Backend, NaiveF32, RunOptions};
use crate::cases::Case;
use crate::inputs::Inputs;
use crate::outputs::Outputs;
use crate::precision_class::PrecisionClass;
use crate::spec::{DType, Level, OutputName};
use anyhow::{anyhow, Context, Result};
use rayon::prelude::*;
use std::sync::Arc;

/// What one call returns to the host loop.
#[derive(Debug, Clone)]
pub struct Eval {
    /// Loss.
    pub loss: f64,
    /// [B,T] per-token logp (the rollout's old_logp); None when the implementation
    /// declares it not provided (a whole-loss library that exposes no per-token logp).
    pub logp: Option<Vec<f32>>,
    /// [H,V] gradient w.r.t. the LM head, as returned (case dtype values).
    pub dlm_head: Vec<f32>,
    /// [B,T] clipped indicator (0/1); None when declared not provided.
    pub clipped: Option<Vec<f32>>,
}

/// One evaluation of the loss at the parameters in `inputs.lm_head`.
pub trait LossFn: Send {
    /// Loss, logp and dlm_head of `case` on `inputs` (fused level: hidden and lm_head set).
    fn eval(&mut self, case: &Case, inputs: &Inputs) -> Result<Eval>;

    /// The precision manifest of the module it runs, once it has run (exported
    /// implementations); None for host loops.
    fn precision(&self) -> Option<crate::precision::PrecisionReport> {
        None
    }
}

fn output(o: &Outputs, name: OutputName) -> Result<&[f32]> {
    o.get(name)
        .map(|t| t.data.as_slice())
        .ok_or_else(|| anyhow!("the implementation returned no `{name}`"))
}

/// An output the loop can do without: None when the implementation declares it not
/// provided, an error when it is missing undeclared.
fn optional(o: &Outputs, name: OutputName) -> Result<Option<Vec<f32>>> {
    if o.not_provided.contains(&name) {
        return Ok(None);
    }
    output(o, name).map(|x| Some(x.to_vec()))
}

pub(crate) fn eval_of(o: &Outputs) -> Result<Eval> {
    Ok(Eval {
        loss: output(o, OutputName::Loss)?[0] as f64,
        logp: optional(o, OutputName::PerTokenLogp)?,
        dlm_head: output(o, OutputName::DlmHead)?.to_vec(),
        clipped: optional(o, OutputName::Clipped)?,
    })
}

/// A fused-level implementation through its backend, one execution per call.
pub struct BackendFused {
    /// Where it runs.
    pub backend: Arc<dyn Backend>,
    /// Implementation name.
    pub implementation: String,
    /// The module's precision manifest, from its first run.
    pub precision: Option<crate::precision::PrecisionReport>,
}

impl LossFn for BackendFused {
    fn eval(&mut self, case: &Case, inputs: &Inputs) -> Result<Eval> {
        let r = self
            .backend
            .run(&self.implementation, case, inputs, &ONCE)?;
        if self.precision.is_none() {
            self.precision = r.precision.clone();
        }
        eval_of(
            r.outputs
                .as_ref()
                .context("the backend returned no outputs")?,
        )
    }

    fn precision(&self) -> Option<crate::precision::PrecisionReport> {
        self.precision.clone()
    }
}

/// One execution, untimed.
const ONCE: RunOptions = RunOptions {
    warmup: 0,
    repeats: 0,
};

/// The logits-level function a [`HostLogits`] feeds.
pub enum LogitsFn {
    /// The plain-f32 reference (`naive_f32`).
    Naive,
    /// A logits-level implementation through its backend, exported for [`logits_twin`].
    Backend {
        /// Where it runs.
        backend: Arc<dyn Backend>,
        /// Implementation name.
        implementation: String,
    },
}

/// The host's f32 fused level around a logits-level function; `bias` multiplies the
/// returned LM-head gradient by 1 + bias (the should-fail variant; 0 otherwise); `class`
/// rounds the operands of the two gradient products (dz and hidden, dz and lm_head) as
/// that precision class feeds them (`f32`: not at all).
pub struct HostLogits {
    /// The logits-level function.
    pub via: LogitsFn,
    /// Relative bias of dlm_head.
    pub bias: f32,
    /// How the gradient products' operands are rounded.
    pub class: Rounding,
}

/// How a [`HostLogits`] rounds the operands of its gradient products.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rounding {
    /// As a precision class feeds them.
    Class(PrecisionClass),
    /// To `bits` significant bits, with the exponent range of f32 (the tests' 8-bit
    /// floats: e4m3 keeps 4 bits); below every class.
    Bits(u32),
}

impl Rounding {
    /// `x` rounded.
    pub fn round(self, x: f32) -> f32 {
        match self {
            Rounding::Class(c) => c.round(x),
            Rounding::Bits(b) => crate::precision_class::round_bits(x, b),
        }
    }

    /// Whether it keeps every bit.
    fn exact(self) -> bool {
        self == Rounding::Class(PrecisionClass::F32)
    }
}

/// The logits-level case a [`HostLogits`] evaluates for fused `case`: same B, T, V, knobs
/// and data id; f32 logits (the host's f32 product, `logits_dtype` f32).
pub fn logits_twin(case: &Case) -> Case {
    let mut c = Case {
        level: Level::Logits,
        dtype: DType::F32,
        shape: crate::cases::Shape {
            h: None,
            ..case.shape
        },
        ..case.clone()
    };
    c.id = c.make_id();
    c
}

/// The host's f32 matmul: out[i, j] = Σ_k a[i, k]·b[k, j] (k ascending), [n,m] from
/// [n,kk] and [kk,m].
fn matmul(a: &[f32], b: &[f32], n: usize, kk: usize, m: usize) -> Vec<f32> {
    let mut out = vec![0f32; n * m];
    out.par_chunks_mut(m).enumerate().for_each(|(i, o)| {
        for k in 0..kk {
            let x = a[i * kk + k];
            for (y, &w) in o.iter_mut().zip(&b[k * m..(k + 1) * m]) {
                *y += x * w;
            }
        }
    });
    out
}

/// [n,m] transposed.
fn transpose(a: &[f32], n: usize, m: usize) -> Vec<f32> {
    let mut t = vec![0f32; n * m];
    for i in 0..n {
        for j in 0..m {
            t[j * n + i] = a[i * m + j];
        }
    }
    t
}

impl HostLogits {
    /// Every fused-level output of `case` on `inputs` (what a plain f32 fused
    /// implementation returns: gradients rounded to the case dtype).
    pub fn outputs(&mut self, case: &Case, inputs: &Inputs) -> Result<Outputs> {
        let s = case.shape;
        let (rows, v, h) = (s.rows(), s.v, s.h.context("fused case without h")?);
        let twin = logits_twin(case);
        let logits_in = Inputs {
            logits: matmul(&inputs.hidden, &inputs.lm_head, rows, h, v),
            hidden: Vec::new(),
            lm_head: Vec::new(),
            ..inputs.clone()
        };
        let mut out = match &self.via {
            LogitsFn::Naive => NaiveF32::default().run(&twin, &logits_in),
            LogitsFn::Backend {
                backend,
                implementation,
            } => backend
                .run(implementation, &twin, &logits_in, &ONCE)?
                .outputs
                .context("the backend returned no outputs")?,
        };
        let dz = out
            .tensors
            .remove(&OutputName::Dlogits)
            .context("the logits-level function returned no `dlogits`")?
            .data;
        let dt = case.dtype;
        let rounded = |x: &[f32]| -> Vec<f32> {
            let c = self.class;
            x.par_iter().map(|&y| c.round(y)).collect()
        };
        use std::borrow::Cow;
        let (dz, hidden, lm_head): (Vec<f32>, Cow<[f32]>, Cow<[f32]>) = if self.class.exact() {
            (
                dz,
                Cow::Borrowed(&inputs.hidden),
                Cow::Borrowed(&inputs.lm_head),
            )
        } else {
            (
                rounded(&dz),
                Cow::Owned(rounded(&inputs.hidden)),
                Cow::Owned(rounded(&inputs.lm_head)),
            )
        };
        let dhidden = matmul(&dz, &transpose(&lm_head, h, v), rows, v, h);
        let mut dlm = matmul(&transpose(&hidden, rows, h), &dz, h, rows, v);
        let k = 1.0 + self.bias;
        dlm.par_iter_mut().for_each(|x| *x = dt.round(*x * k));
        out.insert(
            OutputName::Dhidden,
            vec![s.b, s.t, h],
            dhidden.into_iter().map(|x| dt.round(x)).collect(),
        );
        out.insert(OutputName::DlmHead, vec![h, v], dlm);
        Ok(out)
    }
}

impl LossFn for HostLogits {
    fn eval(&mut self, case: &Case, inputs: &Inputs) -> Result<Eval> {
        eval_of(&self.outputs(case, inputs)?)
    }
}
