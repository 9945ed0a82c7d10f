//! The minijinja environment chat templates run in, with the helpers Hugging Face provides.
//!
//! Templates get `raise_exception`, `strftime_now`, a Python-style `tojson` filter, and the
//! Python string and dict methods templates commonly call (`.strip()`, `.startswith()`,
//! `.split()`, `.items()`, `.get()`, ...).

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, ValueKind, from_args};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State, Value};

/// A fresh environment configured like `transformers`' sandboxed Jinja environment.
pub(crate) fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env.set_unknown_method_callback(python_method);
    env
}

/// The message of a template's `raise_exception(...)` call, kept as the render error's source.
#[derive(Debug)]
pub(crate) struct Raised(pub(crate) String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

fn strftime_now(format: &str) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format_utc(secs, format)
}

/// `json.dumps`-style output: `", "` and `": "` separators, or `indent` spaces per level.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let mut out = Vec::new();
    let result = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let fmt = serde_json::ser::PrettyFormatter::with_indent(&pad);
            serde::Serialize::serialize(
                &value,
                &mut serde_json::Serializer::with_formatter(&mut out, fmt),
            )
        }
        None => serde::Serialize::serialize(
            &value,
            &mut serde_json::Serializer::with_formatter(&mut out, PySeparators),
        ),
    };
    result.map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let text = String::from_utf8(out)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(Value::from_safe_string(text))
}

/// Python's default `json.dumps` separators.
struct PySeparators;

impl serde_json::ser::Formatter for PySeparators {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

/// Python methods on strings and dicts that minijinja lacks natively.
fn python_method(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        return string_method(s, method, args);
    }
    if value.kind() == ValueKind::Map {
        return map_method(state, value, method, args);
    }
    Err(Error::from(ErrorKind::UnknownMethod))
}

fn string_method(s: &str, method: &str, args: &[Value]) -> Result<Value, Error> {
    let trimmed = |chars: Option<&str>, left: bool, right: bool| {
        let strip = |c: char| chars.map_or(c.is_whitespace(), |set| set.contains(c));
        let s = if left { s.trim_start_matches(strip) } else { s };
        let s = if right { s.trim_end_matches(strip) } else { s };
        Value::from(s)
    };
    Ok(match method {
        "strip" => trimmed(from_args::<(Option<&str>,)>(args)?.0, true, true),
        "lstrip" => trimmed(from_args::<(Option<&str>,)>(args)?.0, true, false),
        "rstrip" => trimmed(from_args::<(Option<&str>,)>(args)?.0, false, true),
        "startswith" | "endswith" => {
            let (affix,): (Value,) = from_args(args)?;
            let test = |a: &str| {
                if method == "startswith" {
                    s.starts_with(a)
                } else {
                    s.ends_with(a)
                }
            };
            Value::from(match affix.as_str() {
                Some(a) => test(a),
                None => affix.try_iter()?.any(|a| a.as_str().is_some_and(test)),
            })
        }
        "upper" => Value::from(s.to_uppercase()),
        "lower" => Value::from(s.to_lowercase()),
        "replace" => {
            let (from, to): (&str, &str) = from_args(args)?;
            Value::from(s.replace(from, to))
        }
        "split" => {
            let (sep, maxsplit): (Option<&str>, Option<i64>) = from_args(args)?;
            let parts: Vec<Value> = match (sep, maxsplit) {
                (None, _) => s.split_whitespace().map(Value::from).collect(),
                (Some(sep), Some(n)) if n >= 0 => {
                    let n = usize::try_from(n).unwrap_or(usize::MAX).saturating_add(1);
                    s.splitn(n, sep).map(Value::from).collect()
                }
                (Some(sep), _) => s.split(sep).map(Value::from).collect(),
            };
            Value::from(parts)
        }
        _ => return Err(Error::from(ErrorKind::UnknownMethod)),
    })
}

fn map_method(state: &State, map: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    Ok(match method {
        "items" => {
            let _: () = from_args(args)?;
            state.apply_filter("items", std::slice::from_ref(map))?
        }
        "keys" => {
            let _: () = from_args(args)?;
            Value::from(map.try_iter()?.collect::<Vec<_>>())
        }
        "values" => {
            let _: () = from_args(args)?;
            let values: Result<Vec<Value>, Error> =
                map.try_iter()?.map(|k| map.get_item(&k)).collect();
            Value::from(values?)
        }
        "get" => {
            let (key, default): (Value, Option<Value>) = from_args(args)?;
            let found = map.get_item(&key)?;
            if found.is_undefined() {
                default.unwrap_or(Value::from(()))
            } else {
                found
            }
        }
        _ => return Err(Error::from(ErrorKind::UnknownMethod)),
    })
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// `strftime` over a UTC unix time; supports `%Y %y %m %d %H %M %S %b %B %a %A %j %%` and `%-d`,
/// `%-m`; other directives are copied through.
pub(crate) fn format_utc(secs: u64, format: &str) -> String {
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    let weekday = WEEKDAYS[usize::try_from((days + 4).rem_euclid(7)).unwrap_or(0)];
    let month_name = MONTHS[usize::try_from(month - 1).unwrap_or(0)];
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = chars.next();
        let unpadded = spec == Some('-');
        if unpadded {
            spec = chars.next();
        }
        let num = |n: i64, width: usize| {
            if unpadded {
                n.to_string()
            } else {
                format!("{n:0width$}")
            }
        };
        match spec {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&num(year.rem_euclid(100), 2)),
            Some('m') => out.push_str(&num(month, 2)),
            Some('d') => out.push_str(&num(day, 2)),
            Some('H') => out.push_str(&num(i64::try_from(rem / 3600).unwrap_or(0), 2)),
            Some('M') => out.push_str(&num(i64::try_from(rem / 60 % 60).unwrap_or(0), 2)),
            Some('S') => out.push_str(&num(i64::try_from(rem % 60).unwrap_or(0), 2)),
            Some('j') => out.push_str(&num(day_of_year, 3)),
            Some('b') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('a') => out.push_str(&weekday[..3]),
            Some('A') => out.push_str(weekday),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// (year, month 1–12, day 1–31) of a day count since 1970-01-01, proleptic Gregorian.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Days since 1970-01-01 of a civil date; the inverse of [`civil_from_days`].
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, ctx: Value) -> Result<String, Error> {
        let mut env = environment();
        env.add_template_owned("t", src.to_owned())?;
        env.get_template("t")?.render(ctx)
    }

    #[test]
    fn formats_dates() {
        assert_eq!(format_utc(1_718_409_600, "%d %b %Y"), "15 Jun 2024");
        assert_eq!(
            format_utc(951_782_400, "%a %A %d %b %B %Y %j"),
            "Tue Tuesday 29 Feb February 2000 060"
        );
        assert_eq!(
            format_utc(0, "%Y-%m-%dT%H:%M:%S %a %y %%"),
            "1970-01-01T00:00:00 Thu 70 %"
        );
        assert_eq!(
            format_utc(1_718_409_600 + 3_723, "%-d/%-m %H:%M:%S %q"),
            "15/6 01:02:03 %q"
        );
        for days in [-1000, 0, 59, 365, 11_016, 20_000, 100_000] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }

    #[test]
    fn strftime_now_renders() {
        let out = render("{{ strftime_now('%Y') }}", Value::from(())).unwrap();
        assert_eq!(out.len(), 4);
        assert!(out.starts_with('2'));
    }

    #[test]
    fn tojson_uses_python_separators() {
        let ctx = Value::from_serialize(serde_json::json!({"x": {"a": [1, "b\u{e9}"], "c": null}}));
        assert_eq!(
            render("{{ x | tojson }}", ctx.clone()).unwrap(),
            r#"{"a": [1, "bé"], "c": null}"#
        );
        assert_eq!(
            render("{{ x.a | tojson(indent=2) }}", ctx).unwrap(),
            "[\n  1,\n  \"bé\"\n]"
        );
    }

    #[test]
    fn string_methods() {
        let ctx = Value::from_serialize(serde_json::json!({"s": "  <think>a b</think>  "}));
        let cases = [
            ("{{ s.strip() }}", "<think>a b</think>"),
            ("[{{ s.lstrip() }}]", "[<think>a b</think>  ]"),
            ("[{{ s.rstrip() }}]", "[  <think>a b</think>]"),
            ("{{ s.strip().strip('<>') }}", "think>a b</think"),
            ("{{ s.strip().startswith('<think>') }}", "True"),
            ("{{ s.strip().startswith(['x', '<th']) }}", "True"),
            ("{{ s.strip().endswith('x') }}", "False"),
            ("{{ s.upper().strip() }}", "<THINK>A B</THINK>"),
            ("{{ s.replace(' ', '') }}", "<think>ab</think>"),
            ("{{ s.split('</think>')[-1] | length }}", "2"),
            ("{{ s.split() | length }}", "2"),
            ("{{ 'a,b,c'.split(',', 1) | list }}", r#"["a", "b,c"]"#),
            ("{{ s.lower().strip() }}", "<think>a b</think>"),
        ];
        for (src, want) in cases {
            assert_eq!(render(src, ctx.clone()).unwrap(), want, "{src}");
        }
        assert!(render("{{ s.frobnicate() }}", ctx).is_err());
    }

    #[test]
    fn dict_methods() {
        let ctx = Value::from_serialize(serde_json::json!({"d": {"a": 1, "b": 2}}));
        assert_eq!(
            render(
                "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
                ctx.clone()
            )
            .unwrap(),
            "a=1;b=2;"
        );
        assert_eq!(
            render("{{ d.keys() | join(',') }}", ctx.clone()).unwrap(),
            "a,b"
        );
        assert_eq!(render("{{ d.values() | sum }}", ctx.clone()).unwrap(), "3");
        assert_eq!(
            render(
                "{{ d.get('a') }} {{ d.get('z', 9) }} {{ d.get('z') is none }}",
                ctx
            )
            .unwrap(),
            "1 9 True"
        );
    }

    #[test]
    fn raise_exception_fails_render() {
        let err = render(
            "{{ raise_exception('only user and assistant') }}",
            Value::from(()),
        )
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidOperation);
        assert_eq!(err.detail(), Some("only user and assistant"));
        let source = std::error::Error::source(&err).and_then(|s| s.downcast_ref::<Raised>());
        assert_eq!(
            source.map(|r| r.0.as_str()),
            Some("only user and assistant")
        );
    }

    #[test]
    fn no_html_escaping() {
        let ctx = Value::from_serialize(serde_json::json!({"s": "<a & 'b'>"}));
        assert_eq!(render("{{ s }}", ctx).unwrap(), "<a & 'b'>");
    }
}
