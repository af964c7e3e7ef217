//! Tables a person reads: left-aligned columns two spaces apart, fitted to the width of
//! the terminal stdout is (or to `--width N`): the widest columns' cells are then cut with
//! `…`. Output to a pipe or a file, and `--wide`, keep every cell whole.

use std::sync::Mutex;

/// How tables are fitted: `Some(None)` never cut (`--wide`), `Some(Some(n))` fit to n
/// columns (`--width n`), `None` the terminal's width.
static POLICY: Mutex<Option<Option<usize>>> = Mutex::new(None);

/// `--wide` (never cut a cell) and `--width N` (fit to N columns, terminal or not).
pub fn set_policy(wide: bool, width: Option<usize>) {
    *POLICY.lock().unwrap() = if wide { Some(None) } else { width.map(Some) };
}

/// The width to fit tables to: None when cells are kept whole.
fn target_width() -> Option<usize> {
    match *POLICY.lock().unwrap() {
        Some(explicit) => explicit,
        None => terminal_width(),
    }
}

#[cfg(unix)]
fn terminal_width() -> Option<usize> {
    // SAFETY: isatty and TIOCGWINSZ only read the descriptor's state into `ws`.
    unsafe {
        if libc::isatty(libc::STDOUT_FILENO) != 1 {
            return None;
        }
        let mut ws: libc::winsize = std::mem::zeroed();
        (libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) == 0 && ws.ws_col > 0)
            .then_some(ws.ws_col as usize)
    }
}

#[cfg(not(unix))]
fn terminal_width() -> Option<usize> {
    None
}

const GAP: usize = 2;

/// Column widths that fit `total` characters (with two-space gaps): the widest column is
/// narrowed first, never below its minimum; the natural widths when they fit (or when
/// even the minimums do not).
pub fn fit_widths(natural: &[usize], min: &[usize], total: usize) -> Vec<usize> {
    let mut w = natural.to_vec();
    let gaps = GAP * natural.len().saturating_sub(1);
    while w.iter().sum::<usize>() + gaps > total {
        let Some((k, _)) = w
            .iter()
            .enumerate()
            .filter(|(k, x)| **x > min[*k])
            .max_by_key(|(_, x)| **x)
        else {
            break;
        };
        w[k] -= 1;
    }
    w
}

/// `cell` cut to `width` characters, its end replaced by `…` when cut.
pub fn clip(cell: &str, width: usize) -> String {
    if cell.chars().count() <= width {
        return cell.to_string();
    }
    let mut s: String = cell.chars().take(width.saturating_sub(1)).collect();
    s.push('…');
    s
}

/// The table's lines: header and rows, aligned, fitted to `width` if given.
pub fn lines<const N: usize>(
    head: [&str; N],
    rows: &[[String; N]],
    width: Option<usize>,
) -> Vec<String> {
    let mut natural = head.map(|h| h.chars().count());
    for r in rows {
        for (k, c) in r.iter().enumerate() {
            natural[k] = natural[k].max(c.chars().count());
        }
    }
    // A column keeps its header, and at least 12 characters of a longer cell.
    let min: Vec<usize> = natural
        .iter()
        .zip(head)
        .map(|(&n, h)| n.min(h.chars().count().max(12)))
        .collect();
    let w = match width {
        Some(t) => fit_widths(&natural, &min, t),
        None => natural.to_vec(),
    };
    let line = |r: &[String]| {
        r.iter()
            .enumerate()
            .map(|(k, c)| format!("{:<width$}", clip(c, w[k]), width = w[k]))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    std::iter::once(line(&head.map(String::from)))
        .chain(rows.iter().map(|r| line(r)))
        .collect()
}

/// Prints a table (see the module doc).
pub fn print<const N: usize>(head: [&str; N], rows: &[[String; N]]) {
    for l in lines(head, rows, target_width()) {
        println!("{l}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_fitted_by_narrowing_its_widest_columns() {
        let rows = [[
            "fused/bf16/b1_t8192_v151936_h4096/grpo/eps0.2-0.28/beta0.04/normal1-random-mixed"
                .to_string(),
            "pass".to_string(),
            "dlm_head 1.2e-3, 3 f32 matmuls at DEFAULT (emulated), = 1 device".to_string(),
        ]];
        let head = ["case", "verdict", "worst"];
        let wide = lines(head, &rows, None);
        assert!(wide[1].chars().count() > 140 && !wide[1].contains('…'));
        let fitted = lines(head, &rows, Some(80));
        assert!(
            fitted.iter().all(|l| l.chars().count() <= 80),
            "{fitted:#?}"
        );
        assert!(
            fitted[1].contains("pass") && fitted[1].contains('…'),
            "{fitted:#?}"
        );
        // Nothing is cut when the table fits, nor below the columns' minimums.
        assert_eq!(lines(head, &rows, Some(500)), wide);
        assert_eq!(fit_widths(&[30, 4], &[12, 4], 10), vec![12, 4]);
        assert_eq!(clip("abcdef", 4), "abc…");
        assert_eq!(clip("abc", 4), "abc");
    }
}
