//! Typed reads of request-body fields, one reader for the engine and the gateway: a wrong JSON
//! type becomes the same 400 naming the field, whether the value is a node of a parsed tree (the
//! engine reads the whole request) or a raw slice of the body (the gateway reads a few top-level
//! fields and forwards the rest unparsed). `null` reads as absent, as pydantic's `Optional` does.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::ApiError;

/// One field's JSON value, as either reader holds it.
pub trait FieldValue {
    /// Whether it is `null`.
    fn is_null(&self) -> bool;
    /// Its boolean, if it is one.
    fn as_bool(&self) -> Option<bool>;
    /// Its string, borrowed where the JSON has no escapes, if it is one.
    fn as_text(&self) -> Option<Cow<'_, str>>;
    /// Its number, if it is one.
    fn as_number(&self) -> Option<f64>;
    /// Its integer, if it is one ([`as_int`]'s rule).
    fn as_integer(&self) -> Option<i128>;
}

impl FieldValue for Value {
    fn is_null(&self) -> bool {
        Value::is_null(self)
    }

    fn as_bool(&self) -> Option<bool> {
        Value::as_bool(self)
    }

    fn as_text(&self) -> Option<Cow<'_, str>> {
        self.as_str().map(Cow::Borrowed)
    }

    fn as_number(&self) -> Option<f64> {
        self.as_f64()
    }

    fn as_integer(&self) -> Option<i128> {
        as_int(self)
    }
}

/// A JSON string, borrowed from the body unless it has escapes.
#[derive(Deserialize)]
pub struct Text<'a>(#[serde(borrow)] pub Cow<'a, str>);

impl FieldValue for RawValue {
    fn is_null(&self) -> bool {
        self.get() == "null"
    }

    fn as_bool(&self) -> Option<bool> {
        match self.get() {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        }
    }

    fn as_text(&self) -> Option<Cow<'_, str>> {
        serde_json::from_str::<Text>(self.get()).ok().map(|t| t.0)
    }

    fn as_number(&self) -> Option<f64> {
        serde_json::from_str::<f64>(self.get()).ok()
    }

    fn as_integer(&self) -> Option<i128> {
        let n = serde_json::from_str::<serde_json::Number>(self.get()).ok()?;
        as_int(&Value::Number(n))
    }
}

/// A field that is present and not `null`.
fn given<V: FieldValue + ?Sized>(v: Option<&V>) -> Option<&V> {
    v.filter(|v| !v.is_null())
}

/// A boolean field `key`: `None` when absent or `null`, a 400 when of another type.
pub fn bool_field<V: FieldValue + ?Sized>(
    v: Option<&V>,
    key: &str,
) -> Result<Option<bool>, ApiError> {
    given(v)
        .map(|v| v.as_bool().ok_or_else(|| wrong_type(key, "a boolean")))
        .transpose()
}

/// A string field `key`: `None` when absent or `null`, a 400 when of another type.
pub fn string_field<'v, V: FieldValue + ?Sized>(
    v: Option<&'v V>,
    key: &str,
) -> Result<Option<Cow<'v, str>>, ApiError> {
    given(v)
        .map(|v| v.as_text().ok_or_else(|| wrong_type(key, "a string")))
        .transpose()
}

/// A numeric field `key`: `None` when absent or `null`, a 400 when of another type.
pub fn number_field<V: FieldValue + ?Sized>(
    v: Option<&V>,
    key: &str,
) -> Result<Option<f64>, ApiError> {
    given(v)
        .map(|v| v.as_number().ok_or_else(|| wrong_type(key, "a number")))
        .transpose()
}

/// An integer field `key` (an integral float passes, as pydantic's lax mode lets it): `None`
/// when absent or `null`, a 400 when of another type.
pub fn int_field<V: FieldValue + ?Sized>(
    v: Option<&V>,
    key: &str,
) -> Result<Option<i128>, ApiError> {
    given(v)
        .map(|v| v.as_integer().ok_or_else(|| wrong_type(key, "an integer")))
        .transpose()
}

/// A parsed request body's top-level object (the engine's reader).
pub(crate) struct Fields<'a> {
    map: &'a Map<String, Value>,
}

/// The 400 for a field of the wrong JSON type.
pub fn wrong_type(field: &str, expected: &str) -> ApiError {
    ApiError::bad_request(format!("`{field}` must be {expected}"), Some(field))
}

/// The 400 for a field whose value is out of range.
pub(crate) fn invalid(field: &str, message: String) -> ApiError {
    ApiError::bad_request(message, Some(field))
}

impl<'a> Fields<'a> {
    /// Parses `body` as a JSON object.
    pub(crate) fn parse(body: &[u8]) -> Result<Value, ApiError> {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}"), None))
    }

    /// Views a parsed body, which must be an object.
    pub(crate) fn new(value: &'a Value) -> Result<Self, ApiError> {
        match value {
            Value::Object(map) => Ok(Self { map }),
            _ => Err(ApiError::bad_request(
                "request body must be a JSON object",
                None,
            )),
        }
    }

    /// Every top-level member of the body.
    pub(crate) fn members(&self) -> &'a Map<String, Value> {
        self.map
    }

    /// The raw value of `key`, `None` when missing or null.
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// A boolean field.
    pub(crate) fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        bool_field(self.map.get(key), key)
    }

    /// A string field.
    pub(crate) fn string(&self, key: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(wrong_type(key, "a string")),
        }
    }

    /// A numeric field.
    pub(crate) fn number(&self, key: &str) -> Result<Option<f64>, ApiError> {
        number_field(self.map.get(key), key)
    }

    /// An integer field; floats with no fractional part are accepted, as pydantic's lax mode does.
    pub(crate) fn int(&self, key: &str) -> Result<Option<i128>, ApiError> {
        int_field(self.map.get(key), key)
    }
}

/// A JSON number as an integer, if it is one.
pub fn as_int(v: &Value) -> Option<i128> {
    if let Some(i) = v.as_i64() {
        return Some(i128::from(i));
    }
    if let Some(u) = v.as_u64() {
        return Some(i128::from(u));
    }
    let f = v.as_f64()?;
    // Exact for every integral f64 below 2^63; larger ones are rejected as out of range later.
    (f.fract() == 0.0 && f.abs() < 9.0e18).then_some(f as i128)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_is_absent_and_types_are_checked() {
        let v = Fields::parse(br#"{"a":null,"b":true,"s":"x","n":1.5,"i":3.0,"j":-2}"#).unwrap();
        let f = Fields::new(&v).unwrap();
        assert_eq!(f.bool("a").unwrap(), None);
        assert_eq!(f.bool("missing").unwrap(), None);
        assert_eq!(f.bool("b").unwrap(), Some(true));
        assert_eq!(f.string("s").unwrap(), Some("x"));
        assert_eq!(f.number("n").unwrap(), Some(1.5));
        assert_eq!(f.int("i").unwrap(), Some(3));
        assert_eq!(f.int("j").unwrap(), Some(-2));
        assert_eq!(f.int("n").unwrap_err().param.as_deref(), Some("n"));
        assert_eq!(f.bool("s").unwrap_err().param.as_deref(), Some("s"));
        assert_eq!(f.string("b").unwrap_err().param.as_deref(), Some("b"));
        assert_eq!(f.number("s").unwrap_err().param.as_deref(), Some("s"));
    }

    #[test]
    fn a_raw_slice_reads_as_its_tree_does() {
        let body = r#"{"a":null,"b":true,"s":"x\ny","n":1.5,"i":3.0,"j":-2,"o":{}}"#;
        let tree = Fields::parse(body.as_bytes()).unwrap();
        let raw: std::collections::HashMap<String, &RawValue> = serde_json::from_str(body).unwrap();
        for key in ["a", "b", "s", "n", "i", "j", "o", "missing"] {
            let (t, r) = (tree.get(key), raw.get(key).copied());
            assert_eq!(bool_field(t, key), bool_field(r, key), "{key}");
            assert_eq!(string_field(t, key), string_field(r, key), "{key}");
            assert_eq!(number_field(t, key), number_field(r, key), "{key}");
            assert_eq!(int_field(t, key), int_field(r, key), "{key}");
        }
        assert_eq!(
            string_field(raw.get("s").copied(), "s").unwrap().as_deref(),
            Some("x\ny")
        );
    }

    #[test]
    fn non_object_body_is_rejected() {
        let v = Fields::parse(b"[1,2]").unwrap();
        assert!(Fields::new(&v).is_err());
        let err = Fields::parse(b"{nope").unwrap_err();
        assert!(err.message.starts_with("invalid JSON body: "));
    }

    #[test]
    fn large_integers() {
        assert_eq!(
            as_int(&serde_json::json!(u64::MAX)),
            Some(i128::from(u64::MAX))
        );
        assert_eq!(as_int(&serde_json::json!(1e30)), None);
    }
}
