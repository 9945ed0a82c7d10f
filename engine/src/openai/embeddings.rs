//! `POST /v1/embeddings`: request parsing and the `list` of `embedding` objects it answers.

use serde::Serialize;
use serde_json::Value;

use super::fields::{Fields, invalid, wrong_type};
use super::parse::{model, prompt_list};
use super::{ApiError, Prompt};

/// How the vectors are written in the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodingFormat {
    /// JSON arrays of numbers (the default).
    Float,
    /// Base64 of the little-endian f32 bytes, as OpenAI's SDKs ask for by default.
    Base64,
}

/// A validated embeddings request.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingsRequest {
    /// The `model` named by the client.
    pub model: String,
    /// One input per vector, in request order.
    pub inputs: Vec<Prompt>,
    /// `encoding_format`.
    pub format: EncodingFormat,
    /// `dimensions`, when given (checked against the model by the caller).
    pub dimensions: Option<usize>,
}

/// Parses and validates a `/v1/embeddings` body.
pub fn parse_embeddings(body: &[u8]) -> Result<EmbeddingsRequest, ApiError> {
    let value = Fields::parse(body)?;
    let f = Fields::new(&value)?;
    let model = model(&f)?;
    let inputs = prompt_list("input", f.get("input"))?;
    let format = match f.get("encoding_format") {
        None => EncodingFormat::Float,
        Some(Value::String(s)) if s == "float" => EncodingFormat::Float,
        Some(Value::String(s)) if s == "base64" => EncodingFormat::Base64,
        Some(Value::String(s)) => {
            return Err(invalid(
                "encoding_format",
                format!("`encoding_format` must be `float` or `base64`, got `{s}`"),
            ));
        }
        Some(_) => return Err(wrong_type("encoding_format", "a string")),
    };
    let dimensions = match f.int("dimensions")? {
        None => None,
        Some(d) if d >= 1 => Some(usize::try_from(d).unwrap_or(usize::MAX)),
        Some(d) => {
            return Err(invalid(
                "dimensions",
                format!("`dimensions` must be at least 1, got {d}"),
            ));
        }
    };
    Ok(EmbeddingsRequest {
        model,
        inputs,
        format,
        dimensions,
    })
}

/// Scales `v` to unit L2 norm in place; a zero vector stays zero.
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    if norm > 0.0 {
        for x in v.iter_mut() {
            *x = (f64::from(*x) / norm) as f32;
        }
    }
}

/// Standard base64 (with padding) of `bytes`.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The vector as the wire wants it: numbers, or base64 of its little-endian f32 bytes.
#[derive(Serialize)]
#[serde(untagged)]
enum Encoded<'a> {
    Float(&'a [f32]),
    Base64(String),
}

/// The answer: `{"object":"list","data":[{"object":"embedding","index","embedding"}],...}`;
/// `prompt_tokens` is the token count of all inputs together.
pub fn embeddings_response(
    model: &str,
    vectors: &[Vec<f32>],
    format: EncodingFormat,
    prompt_tokens: usize,
) -> String {
    #[derive(Serialize)]
    struct Item<'a> {
        object: &'static str,
        index: usize,
        embedding: Encoded<'a>,
    }
    #[derive(Serialize)]
    struct Usage {
        prompt_tokens: usize,
        total_tokens: usize,
    }
    #[derive(Serialize)]
    struct Body<'a> {
        object: &'static str,
        data: Vec<Item<'a>>,
        model: &'a str,
        usage: Usage,
    }
    let data = vectors
        .iter()
        .enumerate()
        .map(|(index, v)| Item {
            object: "embedding",
            index,
            embedding: match format {
                EncodingFormat::Float => Encoded::Float(v),
                EncodingFormat::Base64 => {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    Encoded::Base64(base64(&bytes))
                }
            },
        })
        .collect();
    let body = Body {
        object: "list",
        data,
        model,
        usage: Usage {
            prompt_tokens,
            total_tokens: prompt_tokens,
        },
    };
    // Strings, integers and finite floats only (vectors are normalised model outputs; a
    // non-finite float serializes as null rather than failing).
    serde_json::to_string(&body).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_of_every_shape_parse() {
        let r = parse_embeddings(br#"{"model":"m","input":"hi"}"#).unwrap();
        assert_eq!(r.inputs, vec![Prompt::Text("hi".into())]);
        assert_eq!(r.format, EncodingFormat::Float);
        let r = parse_embeddings(br#"{"model":"m","input":["a","b"]}"#).unwrap();
        assert_eq!(r.inputs.len(), 2);
        let r = parse_embeddings(br#"{"model":"m","input":[1,2,3]}"#).unwrap();
        assert_eq!(r.inputs, vec![Prompt::Tokens(vec![1, 2, 3])]);
        let r = parse_embeddings(
            br#"{"model":"m","input":[[1],[2,3]],"encoding_format":"base64","dimensions":8}"#,
        )
        .unwrap();
        assert_eq!(r.inputs.len(), 2);
        assert_eq!(r.format, EncodingFormat::Base64);
        assert_eq!(r.dimensions, Some(8));
    }

    #[test]
    fn bad_fields_name_their_param() {
        let param = |body: &str| {
            parse_embeddings(body.as_bytes())
                .unwrap_err()
                .param
                .unwrap_or_default()
        };
        assert_eq!(param(r#"{"model":"m"}"#), "input");
        assert_eq!(param(r#"{"model":"m","input":[]}"#), "input");
        assert_eq!(param(r#"{"model":"m","input":""}"#), "input");
        assert_eq!(param(r#"{"model":"m","input":[1,"a"]}"#), "input");
        assert_eq!(param(r#"{"model":"m","input":{}}"#), "input");
        assert_eq!(param(r#"{"input":"x"}"#), "model");
        assert_eq!(
            param(r#"{"model":"m","input":"x","encoding_format":"int8"}"#),
            "encoding_format"
        );
        assert_eq!(
            param(r#"{"model":"m","input":"x","dimensions":0}"#),
            "dimensions"
        );
    }

    #[test]
    fn base64_matches_the_standard_alphabet() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        // 1.0f32 little-endian is 00 00 80 3f.
        assert_eq!(base64(&1.0f32.to_le_bytes()), "AACAPw==");
    }

    #[test]
    fn normalised_and_shaped() {
        let mut v = vec![3.0, 4.0];
        l2_normalize(&mut v);
        assert!((v[0] - 0.6).abs() < 1e-6 && (v[1] - 0.8).abs() < 1e-6);
        let body = embeddings_response("m", &[v.clone(), v], EncodingFormat::Float, 7);
        let j: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(j["object"], "list");
        assert_eq!(j["model"], "m");
        assert_eq!(j["data"][1]["index"], 1);
        assert_eq!(j["data"][0]["object"], "embedding");
        assert_eq!(j["data"][0]["embedding"].as_array().unwrap().len(), 2);
        assert_eq!(j["usage"]["prompt_tokens"], 7);
        assert_eq!(j["usage"]["total_tokens"], 7);
        let body = embeddings_response("m", &[vec![1.0]], EncodingFormat::Base64, 1);
        let j: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(j["data"][0]["embedding"], "AACAPw==");
    }
}
