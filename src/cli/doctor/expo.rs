//! The Prometheus text exposition format, read back: each sample line as name, labels and
//! value (quoted label values with their escapes), for doctor's scrapes of the gateway.

/// One sample of a scrape.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name (with `_bucket`, `_sum`, `_count` for histogram parts).
    pub name: String,
    /// Labels, in the order written.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
}

impl Sample {
    /// The value of label `name`.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Its labels but `le`, as one key.
    pub fn series_key(&self) -> String {
        let mut key = String::new();
        for (k, v) in self.labels.iter().filter(|(k, _)| k != "le") {
            key.push_str(k);
            key.push('=');
            key.push_str(v);
            key.push(',');
        }
        key
    }
}

/// Parses Prometheus text exposition; lines that are not samples are skipped, values that are
/// not finite numbers too (doctor reads only the gateway's own, checked metrics).
pub fn parse_exposition(text: &str) -> Vec<Sample> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_string();
    let mut labels = Vec::new();
    let mut rest = &line[name_end..];
    if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices();
        let mut key = String::new();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '}' => {
                    end = Some(i + 1);
                    break;
                }
                ',' | ' ' => {}
                '=' => {
                    // A quoted value with `\"`, `\\` and `\n` escapes.
                    let mut value = String::new();
                    chars.next().filter(|(_, q)| *q == '"')?;
                    loop {
                        let (_, c) = chars.next()?;
                        match c {
                            '"' => break,
                            '\\' => match chars.next()?.1 {
                                'n' => value.push('\n'),
                                other => value.push(other),
                            },
                            other => value.push(other),
                        }
                    }
                    labels.push((std::mem::take(&mut key), value));
                }
                other => key.push(other),
            }
        }
        rest = &body[end?..];
    }
    let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
    value.is_finite().then_some(Sample {
        name,
        labels,
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_labels_with_escapes_and_skips_comments() {
        let s = parse_exposition(
            "# HELP x y\nm{a=\"1,2\",b=\"q\\\"x\"} 3\nplain 4.5\nbad{a=\"1\"} NaN\n",
        );
        assert_eq!(s.len(), 2);
        assert_eq!(
            s[0].labels,
            vec![("a".into(), "1,2".into()), ("b".into(), "q\"x".into())]
        );
        assert_eq!(s[1].value, 4.5);
    }
}
