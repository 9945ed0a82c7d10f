//! Text formatting shared by the planners: digit grouping, byte sizes and aligned tables.

/// One gibibyte.
const GIB: f64 = (1u64 << 30) as f64;

/// `n` with thousands separators: 32768 -> "32,768".
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A `usize` with thousands separators.
pub(crate) fn count(n: usize) -> String {
    thousands(n as u64)
}

/// Bytes in GiB with one decimal: "15.0 GiB".
pub(crate) fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / GIB)
}

/// Seconds as milliseconds with two decimals: "6.49 ms".
pub(crate) fn ms(seconds: f64) -> String {
    format!("{:.2} ms", seconds * 1e3)
}

/// Renders rows as columns padded to their widest cell, two spaces apart, each line indented by
/// `indent` spaces. The first column is left-aligned, the others right-aligned (numbers line up).
pub(crate) fn columns(rows: &[Vec<String>], indent: usize) -> String {
    let ncols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..ncols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = " ".repeat(indent);
        for (c, cell) in row.iter().enumerate() {
            let width = widths.get(c).copied().unwrap_or(0);
            if c == 0 {
                line.push_str(&format!("{cell:<width$}"));
            } else {
                line.push_str(&format!("  {cell:>width$}"));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Renders (label, value) pairs as two columns, labels left-aligned and values left-aligned after
/// them (values are sentences, not numbers, so they read from the left).
pub(crate) fn key_values(rows: &[(String, String)], indent: usize) -> String {
    let width = rows
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    let pad = " ".repeat(indent);
    rows.iter()
        .map(|(k, v)| format!("{pad}{k:<width$}  {v}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_digits_by_three() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(32_768), "32,768");
        assert_eq!(thousands(1_264_192), "1,264,192");
    }

    #[test]
    fn sizes_and_times() {
        assert_eq!(gib(16_060_522_496), "15.0 GiB");
        assert_eq!(ms(0.006_49), "6.49 ms");
    }

    #[test]
    fn columns_line_up() {
        let rows = vec![
            vec!["k".to_string(), "E".to_string()],
            vec!["10".to_string(), "2.31".to_string()],
        ];
        assert_eq!(columns(&rows, 2), "  k      E\n  10  2.31\n");
        let kv = vec![
            ("a".to_string(), "x".to_string()),
            ("long".to_string(), "y".to_string()),
        ];
        assert_eq!(key_values(&kv, 0), "a     x\nlong  y\n");
    }
}
