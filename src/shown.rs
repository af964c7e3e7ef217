//! How messages echo a value a user gave: whole when short, cut with its length when
//! long, so that a one-line error stays one line whatever was passed.

/// Characters of a value that messages echo; a longer value is cut there.
pub const SHOWN_CHARS: usize = 80;

/// A value as messages echo it: whole when short, else its first [`SHOWN_CHARS`]
/// characters and its length ("xxxx… (100000 chars)").
pub fn shown(value: &str) -> String {
    let n = value.chars().count();
    if n <= SHOWN_CHARS {
        value.to_string()
    } else {
        let head: String = value.chars().take(SHOWN_CHARS).collect();
        format!("{head}… ({n} chars)")
    }
}

/// [`shown`], quoted as Rust's `{:?}` quotes (an empty value stays visible).
pub fn shown_quoted(value: &str) -> String {
    let n = value.chars().count();
    if n <= SHOWN_CHARS {
        format!("{value:?}")
    } else {
        let head: String = value.chars().take(SHOWN_CHARS).collect();
        format!("{head:?}… ({n} chars)")
    }
}
