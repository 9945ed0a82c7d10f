//! Typed reads of request-body fields; a wrong JSON type becomes a 400 naming the field.

use serde_json::{Map, Value};

use super::ApiError;

/// A request body's top-level object. `null` reads as absent, as pydantic's `Optional` does.
pub(crate) struct Fields<'a> {
    map: &'a Map<String, Value>,
}

/// The 400 for a field of the wrong JSON type.
pub(crate) fn wrong_type(field: &str, expected: &str) -> ApiError {
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

    /// The raw value of `key`, `None` when missing or null.
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// A boolean field.
    pub(crate) fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(wrong_type(key, "a boolean")),
        }
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
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| wrong_type(key, "a number")),
        }
    }

    /// An integer field; floats with no fractional part are accepted, as pydantic's lax mode does.
    pub(crate) fn int(&self, key: &str) -> Result<Option<i128>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => as_int(v)
                .map(Some)
                .ok_or_else(|| wrong_type(key, "an integer")),
        }
    }
}

/// A JSON number as an integer, if it is one.
pub(crate) fn as_int(v: &Value) -> Option<i128> {
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
