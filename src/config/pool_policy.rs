//! One pool's entry of routing.yaml `pools:`, read in the document's one parse: its
//! `PolicyConfig` and where each of its keys was written. `PolicyConfig` carries no places, so
//! the deserializer is wrapped to note every key (with its place) on the way past, and a
//! parameter out of range is reported on its own line without reading the file again.

use std::collections::HashMap;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, forward_to_deserialize_any};
use serde_saphyr::{Location, Spanned};

use crate::routing::PolicyConfig;

/// A pool's policy and the place of every key written under it.
pub(super) struct RawPoolPolicy {
    /// The policy with its parameters (not yet range-checked).
    pub policy: PolicyConfig,
    /// Key name → where it was written.
    pub places: HashMap<String, Location>,
}

impl<'de> Deserialize<'de> for RawPoolPolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut places = Vec::new();
        let policy = PolicyConfig::deserialize(Noting {
            inner: d,
            places: &mut places,
        })?;
        let places = places
            .into_iter()
            .map(|k| (k.value, k.referenced))
            .collect();
        Ok(Self { policy, places })
    }
}

/// A deserializer that hands its value on unchanged, noting the keys of a mapping.
struct Noting<'p, D> {
    inner: D,
    places: &'p mut Vec<Spanned<String>>,
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Noting<'_, D> {
    type Error = D::Error;

    // `PolicyConfig` is internally tagged: serde reads it with `deserialize_any`.
    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        let places = self.places;
        self.inner
            .deserialize_any(NotingVisitor { visitor, places })
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

/// The visitor of `PolicyConfig`, handed mappings that note their keys. Anything but a mapping
/// is refused (with the policy's own wording): the caller then reads the file the lenient way.
struct NotingVisitor<'p, V> {
    visitor: V,
    places: &'p mut Vec<Spanned<String>>,
}

impl<'de, V: Visitor<'de>> Visitor<'de> for NotingVisitor<'_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.visitor.expecting(f)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        let places = self.places;
        self.visitor.visit_map(NotingMap { map, places })
    }
}

/// A mapping whose keys are read with their places, then handed to the policy as strings.
struct NotingMap<'p, A> {
    map: A,
    places: &'p mut Vec<Spanned<String>>,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for NotingMap<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let Some(key) = self.map.next_key::<Spanned<String>>()? else {
            return Ok(None);
        };
        let name = de::value::StringDeserializer::<A::Error>::new(key.value.clone());
        self.places.push(key);
        seed.deserialize(name).map(Some)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        self.map.next_value_seed(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        self.map.size_hint()
    }
}
