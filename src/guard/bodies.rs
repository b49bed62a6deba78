//! What the body of a function that is not built in calls, for the cost rules (`cost`). A
//! function of SQL, PL/pgSQL or another language whose body is text runs what its body says
//! with the arguments it is given (inlined by the planner, or run as it is called), where the
//! walk of the query never looks: citext's `strpos(citext, citext)` is
//! `pg_catalog.strpos(lower($1), lower($2))`. A body is read as words and operators,
//! conservatively (a word in a string or a comment counts too), each word and operator looked
//! up as the functions and operators of that name a superuser owns outside temporary schemas
//! (what a superuser's body is written to call: another role's namesake must not make it
//! refused), whose bodies are read in turn; a SQL-standard body (`RETURN`, `BEGIN ATOMIC`) as
//! the functions its stored tree names. Grammar that calls without a function's name is read
//! as what it calls (`IS NORMALIZED`, `XMLTABLE`, `JSON_QUERY`, ...).

use std::collections::HashSet;
use std::ffi::CString;

use pgrx::pg_sys;

use super::cost;
use super::facts::{Source, C_LANGUAGE, INTERNAL_LANGUAGE};

/// Bodies read within bodies at most, and functions in all: a call deeper or wider is taken
/// as one a rule is about.
const MAX_DEPTH: usize = 4;
const MAX_FUNCTIONS: usize = 64;
/// Bytes of a body read at most (an extension's functions are a few lines).
const MAX_BODY_BYTES: usize = 1 << 20;
/// Words and operators looked up at most, all bodies read for one function together: each is
/// a catalog look-up that leaves an entry in the backend's cache.
const MAX_LOOKUPS: usize = 4096;

/// Operators not looked up by name: arithmetic, comparison and concatenation, common in
/// bodies. Of the built-ins under these names only jsonb's `-` of an array of keys has a rule
/// (a body that applies it to its arguments is not seen).
const PLAIN_OPERATORS: &[&str] = &[
    "+", "-", "*", "/", "%", "^", "<", ">", "=", "<=", ">=", "<>", "!=", "||",
];

/// What a rule of `cost` is about that the body of `function` calls, directly or through the
/// bodies of what it calls (a function's or operator's name as `cost` knows it), or None;
/// None too for a function that is built in or of `LANGUAGE internal` or `c` (whose rules
/// `cost::rule_name` finds).
pub fn ruled_call_in_body(function: pg_sys::Oid) -> Option<String> {
    let mut read = Read {
        seen: Vec::new(),
        lookups: 0,
    };
    body_calls(function, 0, &mut read)
}

/// What has been read for one function: the functions whose bodies were, and how many words
/// and operators were looked up.
struct Read {
    seen: Vec<pg_sys::Oid>,
    lookups: usize,
}

/// The rule's name `function` is called by, when a rule is about it or its body, or, for an
/// aggregate, about one of its support functions.
fn ruled(function: pg_sys::Oid, depth: usize, read: &mut Read) -> Option<String> {
    if let Some(name) = cost::rule_name(function).filter(|name| cost::has_rule(name)) {
        return Some(name);
    }
    // SAFETY: a catalog look-up of a function a catalog row names.
    if unsafe { pg_sys::get_func_prokind(function) }
        == pg_sys::PROKIND_AGGREGATE as std::ffi::c_char
    {
        let (functions, _, _) = super::facts::aggregate_support(function);
        return functions
            .into_iter()
            .find_map(|support| ruled(support, depth + 1, read));
    }
    body_calls(function, depth, read)
}

/// `ruled_call_in_body` at `depth`, with what was `read` so far.
fn body_calls(function: pg_sys::Oid, depth: usize, read: &mut Read) -> Option<String> {
    pgrx::check_for_interrupts!();
    if function.to_u32() < pg_sys::FirstNormalObjectId || read.seen.contains(&function) {
        return None;
    }
    if depth > MAX_DEPTH || read.seen.len() >= MAX_FUNCTIONS {
        return Some("calls nested deeper than the guard reads".into());
    }
    read.seen.push(function);
    let (source, tree) = match body(function)? {
        Ok(body) => body,
        Err(why) => return Some(why),
    };
    // A SQL-standard body, as stored: the functions and operators its nodes name by OID, and
    // the nodes of XMLTABLE and JSON_TABLE (a table function) and of JSON_QUERY and the like,
    // which name none.
    for node in ["{TABLEFUNC ", "{JSONEXPR "] {
        if tree.contains(node) {
            return Some("XMLTABLE, JSON_TABLE or a SQL/JSON query function".into());
        }
    }
    for key in [":funcid ", ":opfuncid ", ":aggfnoid ", ":winfnoid "] {
        for called in numbers_after(&tree, key) {
            if let Some(found) = ruled(called, depth + 1, read) {
                return Some(found);
            }
        }
    }
    let mut looked_up = HashSet::new();
    let mut look_up = |name: &str, read: &mut Read| {
        if !looked_up.insert(name.to_string()) {
            return Some(false);
        }
        pgrx::check_for_interrupts!();
        read.lookups += 1;
        (read.lookups <= MAX_LOOKUPS).then_some(true)
    };
    for word in words(&source) {
        match look_up(&word, read) {
            None => return Some("a body of more words than the guard reads".into()),
            Some(false) => continue,
            Some(true) => {}
        }
        // LIKE, TRIM(... FROM ...) and POSITION(... IN ...) are written as keywords, and so
        // are calls that have no function of their own name.
        let as_keyword = match word.to_ascii_lowercase().as_str() {
            "like" | "ilike" => Some("like"),
            "trim" => Some("btrim"),
            "normalized" => Some("is_normalized"),
            "xmltable" | "json_table" | "json_query" | "json_value" | "json_exists" => {
                Some("XMLTABLE, JSON_TABLE or a SQL/JSON query function")
            }
            _ => None,
        };
        let lower = word.to_ascii_lowercase();
        if let Some(name) = as_keyword.or(cost::has_rule(&lower).then_some(lower.as_str())) {
            return Some(name.to_string());
        }
        for called in named(&word, Catalog::Functions) {
            if let Some(found) = ruled(called, depth + 1, read) {
                return Some(found);
            }
        }
    }
    for operator in operators(&source) {
        if PLAIN_OPERATORS.contains(&operator.as_str()) {
            continue;
        }
        match look_up(&operator, read) {
            None => return Some("a body of more words than the guard reads".into()),
            Some(false) => continue,
            Some(true) => {}
        }
        for called in named(&operator, Catalog::Operators) {
            if let Some(found) = ruled(called, depth + 1, read) {
                return Some(found);
            }
        }
    }
    None
}

/// The body of `function` whose language is neither `internal` nor `c`: its source text and
/// its stored SQL-standard body (each empty when there is none), or why it is not read (a
/// text past `MAX_BODY_BYTES`); None when it is gone or of one of those languages.
fn body(function: pg_sys::Oid) -> Option<Result<(String, String), String>> {
    let found = Source::of_body(function, MAX_BODY_BYTES)?;
    if found.language == INTERNAL_LANGUAGE || found.language == C_LANGUAGE {
        return None;
    }
    if found.too_long {
        return Some(Err("a body too long to read".into()));
    }
    Some(Ok((
        found.source.unwrap_or_default(),
        found.standard_body.unwrap_or_default(),
    )))
}

/// The OIDs written after `key` in a stored node tree (`:funcid 870`).
fn numbers_after(tree: &str, key: &str) -> Vec<pg_sys::Oid> {
    tree.match_indices(key)
        .filter_map(|(at, _)| {
            let rest = &tree[at + key.len()..];
            let digits = rest.split(|c: char| !c.is_ascii_digit()).next()?;
            digits.parse::<u32>().ok().map(pg_sys::Oid::from)
        })
        .collect()
}

/// The words of a body, as written and lower-cased (a quoted name keeps its case): every run
/// of letters (any alphabet's), digits, `_` and `$` that starts with a letter or `_`.
fn words(source: &str) -> Vec<String> {
    source
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$'))
        .filter(|word| word.starts_with(|c: char| c.is_alphabetic() || c == '_'))
        .flat_map(|word| {
            let lower = word.to_ascii_lowercase();
            let written = (lower != word).then(|| word.to_string());
            std::iter::once(lower).chain(written)
        })
        .collect()
}

/// The operators of a body: every run of the characters PostgreSQL's operators are made of,
/// cut where a comment starts (`~~/**/`, `~~--`).
fn operators(source: &str) -> Vec<String> {
    source
        .split(|c: char| !"+-*/<>=~!@#%^&|`?".contains(c))
        .flat_map(|run| run.split("/*").flat_map(|part| part.split("--")))
        .flat_map(|part| part.split("*/"))
        .filter(|operator| !operator.is_empty())
        .map(str::to_string)
        .collect()
}

/// Which catalog `named` looks a name up in.
#[derive(Clone, Copy)]
enum Catalog {
    Functions,
    Operators,
}

/// The functions named `name`, or the functions of the operators named so, that a superuser
/// owns, outside temporary schemas.
fn named(name: &str, catalog: Catalog) -> Vec<pg_sys::Oid> {
    // A name is at most NAMEDATALEN - 1 bytes: a longer one is cut as the parser cuts it.
    let mut end = name.len().min(pg_sys::NAMEDATALEN as usize - 1);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    let Ok(key) = CString::new(&name[..end]) else {
        return Vec::new();
    };
    let cache = match catalog {
        Catalog::Functions => pg_sys::SysCacheIdentifier::PROCNAMEARGSNSP,
        Catalog::Operators => pg_sys::SysCacheIdentifier::OPERNAMENSP,
    };
    // A look-up by the first key, a name, given as a C string as PostgreSQL's own look-ups
    // give it.
    // SAFETY: the list is released before returning; each member is a tuple of the catalog
    // the cache is of, read as its struct.
    unsafe {
        let list = pg_sys::SearchSysCacheList(
            cache as i32,
            1,
            pg_sys::Datum::from(key.as_ptr()),
            pg_sys::Datum::from(0),
            pg_sys::Datum::from(0),
        );
        if list.is_null() {
            return Vec::new();
        }
        let members = (*list)
            .members
            .as_slice(usize::try_from((*list).n_members).unwrap_or(0));
        let found = members
            .iter()
            .filter_map(|&member| {
                let tuple: pg_sys::HeapTuple = &raw mut (*member).tuple;
                let (function, owner, schema) = match catalog {
                    Catalog::Functions => {
                        let form = pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_proc>(tuple);
                        ((*form).oid, (*form).proowner, (*form).pronamespace)
                    }
                    Catalog::Operators => {
                        let form =
                            pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_operator>(tuple);
                        ((*form).oprcode, (*form).oprowner, (*form).oprnamespace)
                    }
                };
                (pg_sys::superuser_arg(owner) && !pg_sys::isAnyTempNamespace(schema))
                    .then_some(function)
            })
            .collect();
        pg_sys::ReleaseCatCacheList(list);
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_is_read_as_its_words_and_operators() {
        let body = "SELECT pg_catalog.strpos( pg_catalog.lower( $1::pg_catalog.text ), 'a%' ) \
                    WHERE $2 ~~* x OR a <-> b";
        let words = words(body);
        assert!(words.contains(&"strpos".to_string()));
        assert!(words.contains(&"pg_catalog".to_string()));
        assert!(!words
            .iter()
            .any(|w| w.starts_with('$') || w.starts_with('1')));
        assert_eq!(operators(body), vec!["%", "~~*", "<->"]);
        // A quoted name keeps its case beside the lower-cased word; any alphabet's letters.
        let words = super::words("SELECT \"FindAt\"(x), fünd(y)");
        assert!(words.contains(&"FindAt".to_string()));
        assert!(words.contains(&"findat".to_string()));
        assert!(words.contains(&"fünd".to_string()));
        // An operator is cut where a comment starts.
        assert_eq!(operators("a ~~/**/ b --x\n c @>-- d"), vec!["~~", "@>"]);
    }

    #[test]
    fn a_stored_body_names_its_functions_by_oid() {
        let tree = "({QUERY :commandType 1 :targetList ({TARGETENTRY :expr {FUNCEXPR \
                    :funcid 868 :funcresulttype 23} } {OPEXPR :opno 1209 :opfuncid 850})})";
        assert_eq!(
            numbers_after(tree, ":funcid "),
            vec![pg_sys::Oid::from(868)]
        );
        assert_eq!(
            numbers_after(tree, ":opfuncid "),
            vec![pg_sys::Oid::from(850)]
        );
    }
}
