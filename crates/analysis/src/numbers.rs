//! Numbers as the text reports print them, for every module below the
//! reports (the index's progress messages too).

/// Formats a number with thousands separators, like memcheck: `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        let left = digits.len() - i;
        if i > 0 && left / 3 * 3 == left {
            out.push(',');
        }
        out.push(c);
    }
    out
}
