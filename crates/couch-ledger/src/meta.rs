//! Metadata: a small map of string keys to string values that a caller attaches to a transfer,
//! an account or an order's money entry when it creates it (an order number, a customer id, a
//! payment provider's reference). Written once with the document, returned wherever the
//! document is read, never part of the money: two writes of one id that differ only in their
//! metadata are the same transfer or entry, and the first write's metadata stays.
//!
//! Transfers are found by one key and value (`Ledger::transfers_by_meta`, in `by_meta`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::error::{Error, Result};

/// The most keys one document's metadata holds.
pub const META_KEYS_MAX: usize = 16;
/// The longest key, in characters: ASCII letters, digits, `_` and `-`.
pub const META_KEY_CHARS_MAX: usize = 40;
/// The longest value, in characters (any but control characters; at least one).
pub const META_VALUE_CHARS_MAX: usize = 256;

/// The field of a document that holds its metadata.
pub(crate) const FIELD: &str = "meta";

/// String keys to string values, at most [`META_KEYS_MAX`] of them, each key at most
/// [`META_KEY_CHARS_MAX`] characters of `A-Z a-z 0-9 _ -`, each value 1 to
/// [`META_VALUE_CHARS_MAX`] characters without control characters. Kept in key order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Metadata(BTreeMap<String, String>);

impl Metadata {
    /// No keys.
    pub fn new() -> Metadata {
        Metadata::default()
    }

    /// Whether it holds no key.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many keys it holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// Every key and value, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Adds `key` = `value`.
    ///
    /// # Errors
    ///
    /// A key or value outside the rules above, a key given twice, one key more than
    /// [`META_KEYS_MAX`] (invalid input naming `meta`).
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<String>) -> Result<()> {
        let (key, value) = (key.into(), value.into());
        check_key(&key)?;
        check_value(&key, &value)?;
        if self.0.contains_key(&key) {
            return Err(invalid(format!("key {key:?} is given twice")));
        }
        if self.0.len() == META_KEYS_MAX {
            return Err(invalid(format!("holds at most {META_KEYS_MAX} keys")));
        }
        self.0.insert(key, value);
        Ok(())
    }

    /// Metadata from `key=value` texts (the command line's `--meta`): each split at its first
    /// `=`, so a value may hold `=`.
    ///
    /// # Errors
    ///
    /// A text without `=`, and as [`Metadata::insert`].
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = &'a str>) -> Result<Metadata> {
        let mut meta = Metadata::new();
        for pair in pairs {
            let (key, value) = split_pair(pair)?;
            meta.insert(key, value)?;
        }
        Ok(meta)
    }

    /// Checks metadata that was built without [`Metadata::insert`] (deserialized from a
    /// request body).
    ///
    /// # Errors
    ///
    /// As [`Metadata::insert`].
    pub fn check(&self) -> Result<()> {
        if self.0.len() > META_KEYS_MAX {
            return Err(invalid(format!(
                "holds {} keys; at most {META_KEYS_MAX}",
                self.0.len()
            )));
        }
        for (key, value) in &self.0 {
            check_key(key)?;
            check_value(key, value)?;
        }
        Ok(())
    }

    /// What a stored document holds under `meta`: its string values, anything else left out
    /// (a document written by hand never makes a read fail over its metadata).
    pub(crate) fn stored(doc: &Map<String, Value>) -> Metadata {
        let Some(Value::Object(map)) = doc.get(FIELD) else {
            return Metadata::new();
        };
        Metadata(
            map.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect(),
        )
    }

    /// Puts this metadata into a document's fields, nothing when empty (every byte of a
    /// transfer document is written per transfer).
    pub(crate) fn store(&self, doc: &mut Map<String, Value>) {
        if !self.is_empty() {
            doc.insert(FIELD.to_owned(), json!(self.0));
        }
    }
}

/// `key=value` split at the first `=`.
pub fn split_pair(pair: &str) -> Result<(&str, &str)> {
    pair.split_once('=')
        .ok_or_else(|| invalid(format!("{pair:?} is not key=value")))
}

pub(crate) fn invalid(why: String) -> Error {
    Error::invalid(FIELD, why)
}

pub(crate) fn check_key(key: &str) -> Result<()> {
    let chars_ok = key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if key.is_empty() || key.len() > META_KEY_CHARS_MAX || !chars_ok {
        return Err(invalid(format!(
            "key {key:?} must be 1 to {META_KEY_CHARS_MAX} characters of A-Z a-z 0-9 _ -"
        )));
    }
    Ok(())
}

pub(crate) fn check_value(key: &str, value: &str) -> Result<()> {
    let chars = value.chars().count();
    if chars == 0 || chars > META_VALUE_CHARS_MAX || value.chars().any(char::is_control) {
        return Err(invalid(format!(
            "the value of {key:?} must be 1 to {META_VALUE_CHARS_MAX} characters, none of \
             them a control character"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_are_checked() {
        let mut m = Metadata::new();
        m.insert("order_id", "A-42").unwrap();
        m.insert("note", "x=y ü").unwrap();
        assert_eq!(m.get("order_id"), Some("A-42"));
        for (k, v) in [
            ("", "v"),
            ("a.b", "v"),
            ("a b", "v"),
            (&"k".repeat(META_KEY_CHARS_MAX + 1) as &str, "v"),
            ("k", ""),
            ("k", "a\nb"),
            ("k", &"v".repeat(META_VALUE_CHARS_MAX + 1)),
            ("order_id", "again"),
        ] {
            let e = m.clone().insert(k, v).unwrap_err();
            assert!(e.is_invalid_input(), "{k:?}={v:?}: {e}");
        }
        m.insert("k", "v".repeat(META_VALUE_CHARS_MAX)).unwrap();
        let mut full = Metadata::new();
        for i in 0..META_KEYS_MAX {
            full.insert(format!("k{i}"), "v").unwrap();
        }
        assert!(full.insert("one_more", "v").unwrap_err().is_invalid_input());
    }

    #[test]
    fn pairs_split_at_the_first_equals_sign() {
        let m = Metadata::from_pairs(["a=1", "b=x=y"]).unwrap();
        assert_eq!(m.get("a"), Some("1"));
        assert_eq!(m.get("b"), Some("x=y"));
        assert!(Metadata::from_pairs(["novalue"]).is_err());
        assert!(Metadata::from_pairs(["a=1", "a=2"]).is_err());
    }

    #[test]
    fn stored_metadata_reads_back_and_skips_what_is_not_text() {
        let mut m = Metadata::new();
        m.insert("a", "1").unwrap();
        let mut doc = Map::new();
        Metadata::new().store(&mut doc);
        assert!(doc.is_empty(), "empty metadata is not written");
        m.store(&mut doc);
        assert_eq!(Metadata::stored(&doc), m);
        doc.insert(FIELD.into(), json!({"a": "1", "n": 2, "o": {}}));
        assert_eq!(Metadata::stored(&doc), m);
        doc.insert(FIELD.into(), json!([1]));
        assert!(Metadata::stored(&doc).is_empty());
    }
}
