//! The host optimizers of a trajectory, in the precision of the loop that runs them: f32
//! state for the implementation and the plain-f32 reference, f64 for the exact loop.

use crate::cases::trajectory::Optimizer;

/// The arithmetic an optimizer needs (f32 and f64).
pub trait Real: Copy + Send + Sync + 'static {
    /// Conversion from f64 (rounds for f32).
    fn of(x: f64) -> Self;
    /// Widening to f64.
    fn wide(self) -> f64;
    /// The optimizer update on one element (see [`OptimizerState::step`]).
    fn adam(theta: &mut Self, m: &mut Self, v: &mut Self, g: Self, c: &AdamConsts);
    /// θ − lr·g.
    fn sgd(theta: &mut Self, g: Self, lr: f64);
}

/// Adam's constants at one step, precomputed in f64 and converted once.
#[derive(Debug, Clone, Copy)]
pub struct AdamConsts {
    /// Step size.
    pub lr: f64,
    /// 1 − β₁ᵗ.
    pub bc1: f64,
    /// 1 − β₂ᵗ.
    pub bc2: f64,
}

/// Adam's β₁.
pub const BETA1: f64 = 0.9;
/// Adam's β₂.
pub const BETA2: f64 = 0.999;
/// Adam's ε.
pub const EPS: f64 = 1e-8;

macro_rules! real {
    ($t:ty) => {
        impl Real for $t {
            fn of(x: f64) -> Self {
                x as $t
            }
            fn wide(self) -> f64 {
                self as f64
            }
            fn adam(theta: &mut Self, m: &mut Self, v: &mut Self, g: Self, c: &AdamConsts) {
                let (b1, b2) = (BETA1 as $t, BETA2 as $t);
                *m = b1 * *m + (1.0 - b1) * g;
                *v = b2 * *v + (1.0 - b2) * g * g;
                let mh = *m / c.bc1 as $t;
                let vh = *v / c.bc2 as $t;
                *theta -= c.lr as $t * mh / (vh.sqrt() + EPS as $t);
            }
            fn sgd(theta: &mut Self, g: Self, lr: f64) {
                *theta -= lr as $t * g;
            }
        }
    };
}
real!(f32);
real!(f64);

/// An optimizer with its state, over parameters of type `T`.
#[derive(Debug, Clone)]
pub struct OptimizerState<T: Real> {
    kind: Optimizer,
    lr: f64,
    t: i32,
    m: Vec<T>,
    v: Vec<T>,
}

impl<T: Real> OptimizerState<T> {
    /// A fresh optimizer for `n` parameters.
    pub fn new(kind: Optimizer, lr: f64, n: usize) -> Self {
        let state = |k| {
            if kind == Optimizer::Adam {
                vec![T::of(0.0); k]
            } else {
                Vec::new()
            }
        };
        OptimizerState {
            kind,
            lr,
            t: 0,
            m: state(n),
            v: state(n),
        }
    }

    /// One step: θ ← update(θ, g).
    pub fn step(&mut self, theta: &mut [T], grad: &[T]) {
        assert_eq!(
            theta.len(),
            grad.len(),
            "gradient and parameter sizes differ"
        );
        self.t += 1;
        match self.kind {
            Optimizer::Sgd => {
                for (p, &g) in theta.iter_mut().zip(grad) {
                    T::sgd(p, g, self.lr);
                }
            }
            Optimizer::Adam => {
                let c = AdamConsts {
                    lr: self.lr,
                    bc1: 1.0 - BETA1.powi(self.t),
                    bc2: 1.0 - BETA2.powi(self.t),
                };
                for (((p, m), v), &g) in
                    theta.iter_mut().zip(&mut self.m).zip(&mut self.v).zip(grad)
                {
                    T::adam(p, m, v, g, &c);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sgd_and_adam_take_the_textbook_first_steps() {
        let mut th = vec![1.0f64, -2.0];
        OptimizerState::new(Optimizer::Sgd, 0.5, 2).step(&mut th, &[0.2, -0.4]);
        assert_eq!(th, vec![0.9, -1.8]);
        // Adam's first step is lr·sign(g) (up to ε): m̂ = g, v̂ = g².
        let mut th = vec![1.0f64, -2.0];
        let mut a = OptimizerState::new(Optimizer::Adam, 0.01, 2);
        a.step(&mut th, &[0.2, -0.4]);
        assert!(
            (th[0] - 0.99).abs() < 1e-9 && (th[1] + 1.99).abs() < 1e-9,
            "{th:?}"
        );
        // Second step with the same gradient: still lr·sign(g).
        a.step(&mut th, &[0.2, -0.4]);
        assert!((th[0] - 0.98).abs() < 1e-9, "{th:?}");
    }
}
