//! How many values a JSON document holds, counted without keeping any of them: a reader that
//! makes a tree of what a peer sent (a `serde_json::Value` is 32 bytes, and a document of small
//! numbers holds one per two bytes) looks first, and refuses or accounts for what the tree
//! would take.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// What one JSON value of a tree is counted as in memory, in bytes: a `serde_json::Value` and its
/// share of the array or map holding it.
pub const VALUE_BYTES: usize = 48;

/// Most JSON values one request may hold, whoever reads it (the server an agent's, an attached
/// folder's client the server's): its tree is made only then.
pub const MAX_REQUEST_VALUES: usize = 1_000_000;

/// How many arrays and objects deep `value` nests (at most serde_json's 128 when parsed): what
/// a reader that keeps a tree bounds, for whoever reads it after (the same 128).
pub fn nesting(value: &serde_json::Value) -> usize {
    use serde_json::Value;
    match value {
        Value::Array(items) => 1 + items.iter().map(nesting).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(nesting).max().unwrap_or(0),
        _ => 0,
    }
}

/// What the tree of `json` would take in memory ([`VALUE_BYTES`] a value), counted without
/// making it; an error past `max` values, or when it is not JSON ([`count`]).
pub fn tree_bytes(json: &[u8], max: usize) -> Result<usize, serde_json::Error> {
    count(json, max).map(|values| values.saturating_mul(VALUE_BYTES))
}

/// The values `json` holds (every scalar, array, object and object key counts one), or an
/// error once they pass `max` (nothing past that is read) or when it is not JSON.
pub fn count(json: &[u8], max: usize) -> Result<usize, serde_json::Error> {
    let mut left = max;
    let mut de = serde_json::Deserializer::from_slice(json);
    Counter {
        left: &mut left,
        max,
    }
    .deserialize(&mut de)?;
    de.end()?;
    Ok(max - left)
}

/// Counts one value and, inside it, every value it holds.
struct Counter<'a> {
    left: &'a mut usize,
    max: usize,
}

impl Counter<'_> {
    fn one<E: serde::de::Error>(&mut self) -> Result<(), E> {
        match self.left.checked_sub(1) {
            Some(left) => {
                *self.left = left;
                Ok(())
            }
            None => Err(E::custom(format_args!(
                "it holds more than {} JSON values",
                self.max
            ))),
        }
    }

    fn inner(&mut self) -> Counter<'_> {
        Counter {
            left: self.left,
            max: self.max,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Counter<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Counter<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: serde::de::Error>(mut self, _: bool) -> Result<(), E> {
        self.one()
    }
    fn visit_i64<E: serde::de::Error>(mut self, _: i64) -> Result<(), E> {
        self.one()
    }
    fn visit_u64<E: serde::de::Error>(mut self, _: u64) -> Result<(), E> {
        self.one()
    }
    fn visit_f64<E: serde::de::Error>(mut self, _: f64) -> Result<(), E> {
        self.one()
    }
    fn visit_str<E: serde::de::Error>(mut self, _: &str) -> Result<(), E> {
        self.one()
    }
    fn visit_unit<E: serde::de::Error>(mut self) -> Result<(), E> {
        self.one()
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        self.one()?;
        while seq.next_element_seed(self.inner())?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        self.one()?;
        while map.next_key::<IgnoredAny>()?.is_some() {
            self.one::<A::Error>()?;
            map.next_value_seed(self.inner())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_counted_and_refused_past_the_bound() {
        assert_eq!(count(b"0", 10).unwrap(), 1);
        assert_eq!(
            count(br#"{"a": [1, 2, {"b": null}], "c": "x\"y"}"#, 100).unwrap(),
            10
        );
        let many = format!("[{}0]", "0,".repeat(999));
        assert_eq!(count(many.as_bytes(), 1001).unwrap(), 1001);
        let e = count(many.as_bytes(), 1000).unwrap_err().to_string();
        assert!(e.contains("more than 1000 JSON values"), "{e}");
        assert!(count(b"[1, 2", 10).is_err(), "not JSON");
        assert!(count(b"[1] x", 10).is_err(), "trailing bytes");
        // Nested past serde_json's depth: its own limit, not a stack overflow.
        let deep = "[".repeat(100_000);
        assert!(count(deep.as_bytes(), usize::MAX).is_err());
    }
}
