//! Built-in calls whose work can grow faster than what they are given while PostgreSQL checks
//! for no interrupt: until such a call returns, a cancel, the statement timeout, the memory
//! watch and even `pg_terminate_backend` wait. Finding a string in another compares every
//! place of one with the whole of the other (`strpos`, `replace`, `split_part`,
//! `string_to_array`, `translate`, a trim's set of characters, a LIKE pattern), containment and overlap of
//! arrays and of jsonb compare every element with every other, a JSON path that reads the
//! document again inside a filter, or a variable, takes the square of it (or a higher power),
//! and so may any XPath expression. A generated query makes such a call only when one side is
//! a small constant, or the path is a constant that reads the document once; XPath (`xpath`,
//! `xpath_exists`, `xmlexists`) only when a superuser names the function in
//! `allowed_functions`, XMLTABLE never. Deleting an array of keys from a jsonb compares every
//! key with every other too. Some built-ins make a result whose size a number sets, not their
//! inputs (`lpad`, `rpad`, `format`'s widths, a `char(n)` or `bit(n)` length given as a call's
//! argument, a polygon's points, `array_fill`): the number must be a small constant. Unicode
//! normalization sorts a run of combining marks by insertion, and `ts_rank` compares every
//! pair of query terms, with every lexeme each matches, at every pair of their positions.

use std::ffi::CStr;

use pgrx::{pg_sys, PgList};

use super::facts::{C_LANGUAGE, INTERNAL_LANGUAGE};

/// Bytes of the constant side at most: the work is then at most this many times the other
/// side's size.
pub const MAX_CONSTANT_BYTES: usize = 256;

/// Constants and calls of them, at most, for an expression to count as a small constant.
const MAX_CONSTANT_ELEMENTS: usize = 64;

/// The largest length `lpad` and `rpad` may be asked for, and the widest field `format` may
/// write: their work is then at most this many characters per call.
pub const MAX_COUNT: i64 = 10_000;

/// What a call of a built-in function must look like to be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// The argument at this index is a constant of at most `MAX_CONSTANT_BYTES`.
    SmallConstant(usize),
    /// The argument at this index, when it is an array, is such a constant.
    SmallConstantArray(usize),
    /// One of the first two arguments is such a constant.
    EitherSmallConstant,
    /// The argument at this index is a constant JSON path that names the document (`$`) at its
    /// start only, and no variable.
    ReadsOnce(usize),
    /// The argument at this index is a constant number of at most `MAX_COUNT`.
    SmallCount(usize),
    /// The argument at this index is a constant format of at most `MAX_CONSTANT_BYTES` whose
    /// fields are at most `MAX_COUNT` wide, none of them as wide as an argument says (`*`).
    SmallFormat(usize),
    /// Not made at all (unless a superuser names the function), for this reason.
    Never(&'static str),
}

/// Why XPath is never made.
const XPATH: &str = "an XPath expression can take a time that grows with a power of the \
                     document's size, and libxml2 does not check for cancel until it ends";

/// LIKE and ILIKE (`~~`, `~~*` and their negations, of text, char, name and bytea; the
/// functions' names and the C functions they call).
const LIKE: &[&str] = &[
    "textlike",
    "textnlike",
    "texticlike",
    "texticnlike",
    "bpcharlike",
    "bpcharnlike",
    "bpchariclike",
    "bpcharicnlike",
    "namelike",
    "namenlike",
    "nameiclike",
    "nameicnlike",
    "bytealike",
    "byteanlike",
    "like",
    "notlike",
    "ilike",
    "notilike",
];

/// pg_trgm's word similarity functions and operators (their C functions).
const TRIGRAM_WORD_SIMILARITY: &[&str] = &[
    "pg_trgm:word_similarity",
    "pg_trgm:word_similarity_op",
    "pg_trgm:word_similarity_commutator_op",
    "pg_trgm:word_similarity_dist_op",
    "pg_trgm:word_similarity_dist_commutator_op",
    "pg_trgm:strict_word_similarity",
    "pg_trgm:strict_word_similarity_op",
    "pg_trgm:strict_word_similarity_commutator_op",
    "pg_trgm:strict_word_similarity_dist_op",
    "pg_trgm:strict_word_similarity_dist_commutator_op",
];

/// The rule of the built-in function `name` (or an extension's C function, `module:symbol`)
/// called with `arguments` arguments, if any.
fn rule(name: &str, arguments: usize) -> Option<Rule> {
    use Rule::*;
    Some(match name {
        "strpos" | "position" | "replace" | "split_part" | "string_to_array"
        | "string_to_table" | "translate" => SmallConstant(1),
        "btrim" | "ltrim" | "rtrim" if arguments == 2 => SmallConstant(1),
        // LIKE and ILIKE (`~~`, `~~*` and their negations, of text, char, name and bytea): a
        // `%` is tried at every place of the string against the rest of the pattern.
        name if LIKE.contains(&name) => SmallConstant(1),
        "arraycontains" | "arraycontained" | "arrayoverlap" | "jsonb_contains"
        | "jsonb_contained" | "jsonb_exists_any" | "jsonb_exists_all" | "poly_contain"
        | "poly_contained" | "poly_overlap" | "poly_distance" | "poly_same" | "path_inter"
        | "path_distance" => EitherSmallConstant,
        "jsonb_path_exists"
        | "jsonb_path_match"
        | "jsonb_path_query"
        | "jsonb_path_query_array"
        | "jsonb_path_query_first"
        | "jsonb_path_exists_tz"
        | "jsonb_path_match_tz"
        | "jsonb_path_query_tz"
        | "jsonb_path_query_array_tz"
        | "jsonb_path_query_first_tz"
        | "jsonb_path_exists_opr"
        | "jsonb_path_match_opr" => ReadsOnce(1),
        // `jsonb - text[]`: every key of the document against every key of the array (the
        // other forms, one key or one index, take a small constant as readily).
        "jsonb_delete" => SmallConstantArray(1),
        // A length as a number: `lpad(s, n)`, and a cast's length coercion called as a
        // function, `bpchar(s, n, true)` padding with spaces, `bit(i, n)` with zeros (its
        // typmod, the length, and for `char(n)` four more).
        "lpad" | "rpad" => SmallCount(1),
        "bpchar" | "bit" if arguments >= 2 => SmallCount(1),
        "format" => SmallFormat(0),
        "array_fill" => Never(
            "its result's size is what its dimensions say, up to a gigabyte, and PostgreSQL \
             does not check for cancel until it is filled",
        ),
        "xpath" | "xpath_exists" | "xmlexists" => Never(XPATH),
        // Canonical ordering sorts combining marks by insertion, with backtracking: a long run
        // of marks in reverse order takes the square of its length.
        "normalize" | "is_normalized" => Never(
            "Unicode normalization sorts a run of combining marks in a time that grows with \
             the square of its length, and PostgreSQL does not check for cancel until it ends",
        ),
        // Every pair of query terms, each with every lexeme it matches (a prefix may match them
        // all), at every pair of their positions: no small query bounds it. `ts_rank_cd`
        // checks for cancel as it goes.
        "ts_rank" => Never(
            "ranking compares every pair of the query's terms, each with every lexeme it \
             matches, at every pair of their positions, and PostgreSQL does not check for \
             cancel until it ends (ts_rank_cd ranks by cover density and checks)",
        ),
        // A polygon of as many points as asked for, from a circle.
        "polygon" if arguments == 2 => SmallCount(0),
        // Extensions' C functions (`module:symbol`), of the contrib modules a DBA allows for
        // analytics. ltree: a text query's every item against every level of the path, with
        // no check for cancel (`ltree @ ltxtquery`, and of an array of paths); the index of
        // one path in another compares every level with every other.
        "ltree:ltxtq_exec" | "ltree:_ltxtq_exec" => SmallConstant(1),
        "ltree:ltxtq_rexec" | "ltree:_ltxtq_rexec" => SmallConstant(0),
        "ltree:ltree_index" => EitherSmallConstant,
        // pg_trgm's word similarity, up to PostgreSQL 16: a repeated trigram makes it walk the
        // rest of the string again at each place, with no check for cancel (17 checks).
        name if TRIGRAM_WORD_SIMILARITY.contains(&name) && pg_sys::PG_VERSION_NUM < 170000 => {
            Never(
                "a repeated trigram takes it a time that grows with the square of the \
                 string's length, and this release of pg_trgm does not check for cancel",
            )
        }
        // pgcrypto's `crypt`: sha-crypt hashes the square of the password's length first.
        "pgcrypto:pg_crypt" => Never(
            "hashing a password takes a time that grows with the square of its length, and \
             pgcrypto does not check for cancel until it has",
        ),
        // xml2's XPath and XSLT, the same libxml2 engine as the built-in xpath.
        "pgxml:xpath_string"
        | "pgxml:xpath_number"
        | "pgxml:xpath_bool"
        | "pgxml:xpath_nodeset"
        | "pgxml:xpath_list"
        | "pgxml:xslt_process" => Never(XPATH),
        _ => return None,
    })
}

/// Why the call of the built-in function `name` with `arguments` (an analysed argument list)
/// under `collation` (its input collation) may not be made, or None.
///
/// # Safety
/// `arguments` is a List of analysed expressions, or null.
pub unsafe fn call_refusal(
    name: &str,
    arguments: *mut pg_sys::List,
    collation: pg_sys::Oid,
) -> Option<String> {
    // Under a nondeterministic collation (PostgreSQL 18 searches and matches LIKE so), a
    // search compares the rest of the string at every place of it, each comparison walking
    // past ignorable characters, with no check for cancel between: no small constant bounds
    // it, for LIKE and for strpos, replace, split_part and the like alike.
    if collation != pg_sys::InvalidOid
        // SAFETY: a catalog look-up of a collation the analysed call names.
        && !unsafe { pg_sys::get_collation_isdeterministic(collation) }
    {
        return Some(
            "under a nondeterministic collation it compares the rest of the string at every \
             place of it, and PostgreSQL does not check for cancel until it ends (compare \
             with lower() or COLLATE \"C\")"
                .into(),
        );
    }
    // SAFETY: the caller's contract.
    let arguments = unsafe { PgList::<pg_sys::Node>::from_pg(arguments) };
    let argument = |i: usize| arguments.get_ptr(i).unwrap_or(std::ptr::null_mut());
    // SAFETY: the arguments are analysed expressions.
    unsafe {
        match rule(name, arguments.len())? {
            Rule::SmallConstant(i) => (!small_constant(argument(i))).then(|| {
                format!(
                    "its argument {} must be a constant of at most {MAX_CONSTANT_BYTES} bytes: \
                     its work grows with the product of its arguments' lengths, and \
                     PostgreSQL does not check for cancel until it ends",
                    i + 1
                )
            }),
            Rule::EitherSmallConstant => {
                (!small_constant(argument(0)) && !small_constant(argument(1))).then(|| {
                    format!(
                        "one side must be a constant of at most {MAX_CONSTANT_BYTES} bytes: \
                     it compares every element of one side with every element of the other \
                     (containment, overlap, a path's levels), and PostgreSQL does not check \
                     for cancel until it ends"
                    )
                })
            }
            Rule::SmallConstantArray(i) => {
                let array =
                    pg_sys::get_element_type(pg_sys::exprType(argument(i))) != pg_sys::InvalidOid;
                (array && !small_constant(argument(i))).then(|| {
                    format!(
                        "its argument {} must be a constant array of at most \
                         {MAX_CONSTANT_BYTES} bytes: each key is compared with every key of the \
                         document, and PostgreSQL does not check for cancel until it ends",
                        i + 1
                    )
                })
            }
            Rule::ReadsOnce(i) => path_refusal(argument(i)),
            Rule::SmallCount(i) => (!small_count(argument(i))).then(|| {
                format!(
                    "its argument {} must be a constant of at most {MAX_COUNT}: it sets the \
                     size of the result, which PostgreSQL makes without a check for cancel",
                    i + 1
                )
            }),
            Rule::SmallFormat(i) => (!small_format(argument(i))).then(|| {
                format!(
                    "its format must be a constant of at most {MAX_CONSTANT_BYTES} bytes whose \
                     fields are at most {MAX_COUNT} wide, none as wide as an argument says (*): \
                     PostgreSQL pads a field without a check for cancel"
                )
            }),
            Rule::Never(why) => Some(format!(
                "{why} (a superuser may allow the function by name in \
                 sql_query_engine.allowed_functions)"
            )),
        }
    }
}

/// Why the JSON path `path` (an analysed expression) may not be used, or None: it must be a
/// constant that names the document (`$`) at its start only. A path that names it again
/// inside a filter, or names a variable, compares every item with every other.
///
/// # Safety
/// `path` is an analysed expression, or null.
pub unsafe fn path_refusal(path: *mut pg_sys::Node) -> Option<String> {
    // SAFETY: the caller's contract.
    let text = unsafe { constant_text(path) };
    match text {
        Some(text) if !reads_again(&text) => None,
        Some(_) => Some(
            "its JSON path names the document ($) or a variable inside itself: it compares \
             every item with every other, and PostgreSQL does not check for cancel until it \
             ends (use @ for the current item)"
                .into(),
        ),
        None => Some("its JSON path must be a constant".into()),
    }
}

/// Whether a JSON path, as PostgreSQL writes it out, may compare every item of a sequence
/// with every item of another: outside its strings, it names `$` (or a variable) anywhere but
/// at its start, or its filters name the current item (`@`) more than once or hold more than
/// one sequence (`[*]`, `.*`, `.**`, a range `[a to b]`, a filter). In lax mode, the default,
/// any path may be an array unwrapped into a sequence, so a filter that names two paths may
/// compare every item of one with every item of the other (`@.a == @.b`, `@.a.abs() == @.b`,
/// `@.a == -@.b`); a filter that compares one path with literals is linear. Conservative: a
/// filter of two conditions on two paths (`@.a > 1 && @.b < 2`) is refused too.
fn reads_again(path: &str) -> bool {
    let path = without_strings(path);
    let path = path.trim_start();
    let path = ["strict ", "lax "]
        .iter()
        .find_map(|mode| path.strip_prefix(mode))
        .unwrap_or(path)
        .trim_start();
    let again = match path.strip_prefix('$') {
        Some(rest) => rest.contains('$'),
        None => path.contains('$'),
    };
    let filters = path.find("?(").map_or("", |at| &path[at + 2..]);
    let sequences = filters.matches("[*]").count()
        + filters.matches(".*").count()
        + filters.matches(" to ").count()
        + filters.matches("?(").count();
    again || sequences > 1 || filters.matches('@').count() > 1
}

/// A JSON path as PostgreSQL writes it out, each string (`"..."`, with `\` escapes) left
/// empty: what a string says is no part of the path.
fn without_strings(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut chars = path.chars();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == '"' {
            while let Some(inside) = chars.next() {
                match inside {
                    '\\' => {
                        chars.next();
                    }
                    '"' => {
                        out.push('"');
                        break;
                    }
                    _ => {}
                }
            }
        }
    }
    out
}

/// `node` without the relabelling and collation nodes analysis puts around a constant.
///
/// # Safety
/// `node` is an analysed expression, or null.
unsafe fn bare(mut node: *mut pg_sys::Node) -> *mut pg_sys::Node {
    // SAFETY: the caller's contract; each node is cast to the struct its tag names.
    unsafe {
        while let Some(n) = node.as_ref() {
            node = match n.type_ {
                pg_sys::NodeTag::T_RelabelType => (*node.cast::<pg_sys::RelabelType>()).arg.cast(),
                pg_sys::NodeTag::T_CollateExpr => (*node.cast::<pg_sys::CollateExpr>()).arg.cast(),
                _ => return node,
            };
        }
        node
    }
}

/// Whether `node` is a constant of at most `MAX_CONSTANT_BYTES` (a NULL is), or an array of
/// at most `MAX_CONSTANT_ELEMENTS` constants and calls, at every depth together: what the planner
/// folds it into, as written, is at most that long, whatever its pieces.
///
/// # Safety
/// `node` is an analysed expression, or null.
unsafe fn small_constant(node: *mut pg_sys::Node) -> bool {
    let mut elements = MAX_CONSTANT_ELEMENTS;
    // SAFETY: the caller's contract.
    unsafe {
        // A constant of an extension's type given as it is (ltree's `ltxtquery`): the call
        // works on what it stores, and its text is not written (its output function is the
        // extension's code, which nothing asked to run).
        let bare = bare(node);
        let constant = bare.cast::<pg_sys::Const>();
        if bare
            .as_ref()
            .is_some_and(|n| n.type_ == pg_sys::NodeTag::T_Const)
            && (*constant).consttype.to_u32() >= pg_sys::FirstNormalObjectId
            && !(*constant).constisnull
            && (*constant).constlen == -1
        {
            return pg_sys::toast_raw_datum_size((*constant).constvalue) <= MAX_CONSTANT_BYTES;
        }
        written_bound(node, &mut elements).is_some_and(|bytes| bytes <= MAX_CONSTANT_BYTES)
    }
}

/// An upper bound of the bytes of the text that `node`, a constant or built-in calls of
/// constants the planner folds into one, is written in, taking the constants and arguments it
/// holds from `elements` left; None when it is something else, or its bound passes
/// `MAX_CONSTANT_BYTES`.
///
/// # Safety
/// `node` is an analysed expression, or null.
unsafe fn written_bound(node: *mut pg_sys::Node, elements: &mut usize) -> Option<usize> {
    let within = |bytes: usize| (bytes <= MAX_CONSTANT_BYTES).then_some(bytes);
    // SAFETY: the caller's contract; a Const's value is read as its length says.
    unsafe {
        // A relabelling changes the type, and so how the value is written: `16385::oid::regclass`
        // is written as a relation's name. Only to a type whose text is the value's.
        let mut node = node;
        while let Some(n) = node.as_ref() {
            node = match n.type_ {
                pg_sys::NodeTag::T_RelabelType => {
                    let relabel = node.cast::<pg_sys::RelabelType>();
                    let typ = (*relabel).resulttype;
                    if !(CAST_TARGETS.contains(&typ) || writes_what_it_stores(typ)) {
                        return None;
                    }
                    (*relabel).arg.cast()
                }
                pg_sys::NodeTag::T_CollateExpr => (*node.cast::<pg_sys::CollateExpr>()).arg.cast(),
                _ => break,
            };
        }
        let n = node.as_ref()?;
        // `ARRAY[1, 2, 3]`: constants the planner folds into one later, each element written
        // quoted at worst (`"a\"b"`), with a comma.
        if n.type_ == pg_sys::NodeTag::T_ArrayExpr {
            let list =
                PgList::<pg_sys::Node>::from_pg((*node.cast::<pg_sys::ArrayExpr>()).elements);
            let mut bytes = 2usize;
            for element in list.iter_ptr() {
                let element = written_bound(element, elements)?;
                bytes = within(bytes.saturating_add(element.saturating_mul(2).saturating_add(3)))?;
            }
            return Some(bytes);
        }
        // A cast of constants, or a built-in that keeps their size (`lower('X')`, `chr(10)`,
        // `'%' || 'x' || '%'`): constants the planner folds later, written in at most what
        // `growth` says of their arguments' text.
        let call = match n.type_ {
            pg_sys::NodeTag::T_FuncExpr => {
                let call = node.cast::<pg_sys::FuncExpr>();
                let cast = super::facts::is_cast(call);
                Some(((*call).funcid, (*call).args, (*call).funcresulttype, cast))
            }
            pg_sys::NodeTag::T_OpExpr => {
                let call = node.cast::<pg_sys::OpExpr>();
                let function = pg_sys::get_opcode((*call).opno);
                Some((function, (*call).args, (*call).opresulttype, false))
            }
            _ => None,
        };
        if let Some((function, arguments, result, cast)) = call {
            let arguments = PgList::<pg_sys::Node>::from_pg(arguments);
            *elements = elements.checked_sub(1)?;
            // Built-ins only: what another function writes is not known.
            let name = builtin_name(function)?;
            let growth = if cast {
                // Only to a type whose text its value's bounds (a float cast to numeric is
                // written in all its digits, a length coercion to numeric pads with as many; an
                // OID cast to regclass is written as the relation's quoted name, a circle to a
                // polygon as its points).
                if !CAST_TARGETS.contains(&result) {
                    return None;
                }
                match arguments.len() {
                    1 => Growth::Cast,
                    // A length coercion (`varchar(n)`, `char(n)`, `bit(n)`): padded to what its
                    // type modifier (a constant) says at most.
                    _ => Growth::Padded(padding(result, arguments.get_ptr(1)?)?),
                }
            } else {
                growth(&name)?
            };
            // jsonb parses a json argument again and writes its numbers in all their digits
            // (`to_jsonb(json '1e131071')`), and a float's too: only arguments jsonb writes as
            // their text.
            if name.starts_with("to_jsonb") || name.starts_with("jsonb_build") {
                let written_as_text = |argument: *mut pg_sys::Node| {
                    let typ = pg_sys::exprType(argument);
                    writes_what_it_stores(typ) || JSONB_AS_WRITTEN.contains(&typ)
                };
                if !arguments.iter_ptr().all(written_as_text) {
                    return None;
                }
            }
            let mut bytes = 0usize;
            for argument in arguments.iter_ptr() {
                bytes = bytes.saturating_add(written_bound(argument, elements)?);
            }
            return within(growth.bound(bytes, arguments.len()));
        }
        if n.type_ != pg_sys::NodeTag::T_Const {
            return None;
        }
        *elements = elements.checked_sub(1)?;
        let constant = node.cast::<pg_sys::Const>();
        if (*constant).constisnull {
            // `NULL`, as an array writes it.
            return Some(4);
        }
        let stored = match (*constant).constlen {
            -1 => pg_sys::toast_raw_datum_size((*constant).constvalue),
            -2 => CStr::from_ptr((*constant).constvalue.cast_mut_ptr())
                .to_bytes()
                .len(),
            n => usize::try_from(n).unwrap_or(usize::MAX),
        };
        within(stored)?;
        // What the call compares is the constant's text, which for a type other than a
        // string's may be far longer than what it stores (a numeric's `1e131071`, a few bytes,
        // is 131,072 characters once `'' || 1e131071` makes it text): measured as written.
        if writes_what_it_stores((*constant).consttype) {
            Some(stored)
        } else {
            within(constant_text(node)?.len())
        }
    }
}

/// The types a cast of constants may be to for its text to be bounded by its argument's:
/// strings, numbers but numeric, booleans, times, bit strings, JSON.
const CAST_TARGETS: &[pg_sys::Oid] = &[
    pg_sys::TEXTOID,
    pg_sys::VARCHAROID,
    pg_sys::BPCHAROID,
    pg_sys::NAMEOID,
    pg_sys::CHAROID,
    pg_sys::INT2OID,
    pg_sys::INT4OID,
    pg_sys::INT8OID,
    pg_sys::FLOAT4OID,
    pg_sys::FLOAT8OID,
    pg_sys::BOOLOID,
    pg_sys::DATEOID,
    pg_sys::TIMEOID,
    pg_sys::TIMETZOID,
    pg_sys::TIMESTAMPOID,
    pg_sys::TIMESTAMPTZOID,
    pg_sys::INTERVALOID,
    pg_sys::BITOID,
    pg_sys::VARBITOID,
    pg_sys::JSONOID,
    pg_sys::JSONBOID,
];

/// The types other than strings whose constants jsonb writes as their own text: integers,
/// numeric (measured as written, in all its digits), booleans, dates and times.
const JSONB_AS_WRITTEN: &[pg_sys::Oid] = &[
    pg_sys::INT2OID,
    pg_sys::INT4OID,
    pg_sys::INT8OID,
    pg_sys::NUMERICOID,
    pg_sys::BOOLOID,
    pg_sys::DATEOID,
    pg_sys::TIMEOID,
    pg_sys::TIMETZOID,
    pg_sys::TIMESTAMPOID,
    pg_sys::TIMESTAMPTZOID,
];

/// How much longer than its arguments' text a built-in of constants may write its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Growth {
    /// Their text together at most (`concat`, `||`, the trims).
    Sum,
    /// A multiple of it (a case mapping: one character may become three; an escape doubled).
    Times(usize),
    /// A character (`chr`).
    Character,
    /// JSON: each character escaped in six at worst, with quotes and separators.
    Json,
    /// A one-argument cast to one of `CAST_TARGETS`: a boolean's `t` becomes `true`, a date a
    /// timestamp; never more than twice the text and a little.
    Cast,
    /// A length coercion: a cast's growth, and padding of at most this many bytes.
    Padded(usize),
}

impl Growth {
    fn bound(self, bytes: usize, arguments: usize) -> usize {
        match self {
            Growth::Sum => bytes,
            Growth::Times(times) => bytes.saturating_mul(times),
            Growth::Character => 4,
            Growth::Json => bytes
                .saturating_mul(6)
                .saturating_add(arguments.saturating_mul(4))
                .saturating_add(2),
            Growth::Cast => bytes.saturating_mul(2).saturating_add(24),
            Growth::Padded(padding) => Growth::Cast.bound(bytes, arguments).saturating_add(padding),
        }
    }
}

/// The bytes a length coercion to `typ` may pad its value to, by its type modifier
/// (`typmod`, a constant): `char(n)` pads with spaces to n characters, `bit(n)` with zeros to n
/// digits; `varchar(n)` only cuts. None when the modifier is not a constant.
///
/// # Safety
/// `typmod` is an analysed expression, or null.
unsafe fn padding(typ: pg_sys::Oid, typmod: *mut pg_sys::Node) -> Option<usize> {
    // SAFETY: the caller's contract; a Const is read as its type says.
    let typmod = unsafe {
        let node = bare(typmod);
        let n = node.as_ref()?;
        let constant = node.cast::<pg_sys::Const>();
        if n.type_ != pg_sys::NodeTag::T_Const
            || (*constant).consttype != pg_sys::INT4OID
            || (*constant).constisnull
        {
            return None;
        }
        (*constant).constvalue.value() as i32
    };
    let length = usize::try_from(typmod).unwrap_or(0);
    Some(match typ {
        // The modifier of char(n) is n + 4 (VARHDRSZ); a character is 4 bytes at most.
        pg_sys::BPCHAROID => length.saturating_sub(4).saturating_mul(4),
        pg_sys::BITOID | pg_sys::VARBITOID => length,
        pg_sys::VARCHAROID => 0,
        // A time's or an interval's precision: digits of a fraction of a second.
        _ => 16,
    })
}

/// How the built-in `name` of constants grows their text, if it is one the planner folds into
/// a constant whose size its arguments bound.
fn growth(name: &str) -> Option<Growth> {
    Some(match name {
        "concat" | "textcat" | "btrim" | "ltrim" | "rtrim" => Growth::Sum,
        // `'%' || 2023 || '%'`: a constant's text beside another.
        "anytextcat" | "textanycat" => Growth::Sum,
        "lower" | "upper" | "initcap" => Growth::Times(3),
        // LIKE's ESCAPE: the pattern with its escapes doubled at most.
        "like_escape" => Growth::Times(2),
        "chr" => Growth::Character,
        "to_jsonb" | "to_json" | "jsonb_build_object" | "jsonb_build_array"
        | "json_build_object" | "json_build_array" => Growth::Json,
        _ => return None,
    })
}

/// The built-in output functions that write a value as it is stored: text's, varchar's,
/// char(n)'s, name's, "char"'s and an untyped literal's.
const STRING_OUTPUTS: [&str; 6] = [
    "textout",
    "varcharout",
    "bpcharout",
    "nameout",
    "charout",
    "unknownout",
];

/// Whether values of `typ` are written as they are stored: its output function is a string
/// type's (citext's is text's, called through its own `LANGUAGE internal` function).
fn writes_what_it_stores(typ: pg_sys::Oid) -> bool {
    let (mut output, mut varlena) = (pg_sys::InvalidOid, false);
    // SAFETY: a catalog look-up of a type an analysed constant has.
    unsafe { pg_sys::getTypeOutputInfo(typ, &mut output, &mut varlena) };
    rule_name(output).is_some_and(|name| STRING_OUTPUTS.contains(&name.as_str()))
}

/// Whether `node` is a constant integer of at most `MAX_COUNT`, or NULL.
///
/// # Safety
/// `node` is an analysed expression, or null.
unsafe fn small_count(node: *mut pg_sys::Node) -> bool {
    // SAFETY: the caller's contract; a Const's value is read as its type says.
    unsafe {
        let mut node = bare(node);
        // `lpad(s, 5::smallint)`: casts of a constant, which the planner folds (between
        // integer types they keep the value, or fail).
        for _ in 0..4 {
            let Some(call) = node
                .as_ref()
                .filter(|n| n.type_ == pg_sys::NodeTag::T_FuncExpr)
                .map(|_| node.cast::<pg_sys::FuncExpr>())
            else {
                break;
            };
            let cast = matches!(
                (*call).funcformat,
                pg_sys::CoercionForm::COERCE_EXPLICIT_CAST
                    | pg_sys::CoercionForm::COERCE_IMPLICIT_CAST
            );
            let arguments = PgList::<pg_sys::Node>::from_pg((*call).args);
            if !cast
                || arguments.len() != 1
                || (*call).funcid.to_u32() >= pg_sys::FirstNormalObjectId
            {
                return false;
            }
            node = bare(arguments.get_ptr(0).unwrap_or(std::ptr::null_mut()));
        }
        let Some(n) = node.as_ref() else {
            return false;
        };
        if n.type_ != pg_sys::NodeTag::T_Const {
            return false;
        }
        let constant = node.cast::<pg_sys::Const>();
        if (*constant).constisnull {
            return true;
        }
        let value = (*constant).constvalue;
        let number = match (*constant).consttype {
            pg_sys::INT2OID => i64::from(value.value() as i16),
            pg_sys::INT4OID => i64::from(value.value() as i32),
            pg_sys::INT8OID => value.value() as i64,
            _ => return false,
        };
        number <= MAX_COUNT
    }
}

/// Whether `node` is a small constant format (`format`'s first argument) whose fields are at
/// most `MAX_COUNT` wide, none of them as wide as an argument says.
///
/// # Safety
/// `node` is an analysed expression, or null.
unsafe fn small_format(node: *mut pg_sys::Node) -> bool {
    // SAFETY: the caller's contract; a Const is read as its tag says.
    unsafe {
        let bare = bare(node);
        let null = bare
            .as_ref()
            .is_some_and(|n| n.type_ == pg_sys::NodeTag::T_Const)
            && (*bare.cast::<pg_sys::Const>()).constisnull;
        null || (small_constant(node)
            && constant_text(node).is_some_and(|text| narrow_fields(&text)))
    }
}

/// Whether every field of a `format` string (`%[position$][flags][width]type`) is at most
/// `MAX_COUNT` wide and takes no width from an argument (`*`).
fn narrow_fields(format: &str) -> bool {
    let mut rest = format;
    while let Some(at) = rest.find('%') {
        rest = &rest[at + 1..];
        if let Some(after) = rest.strip_prefix('%') {
            rest = after;
            continue;
        }
        let spec_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '$' || c == '-'))
            .unwrap_or(rest.len());
        if rest[spec_end..].starts_with('*') {
            return false;
        }
        let spec = &rest[..spec_end];
        // The width is the digits after the position (`n$`) and the flags.
        let width = spec.rsplit(['$', '-']).next().unwrap_or("");
        if width.len() > 5 || width.parse::<i64>().is_ok_and(|w| w > MAX_COUNT) {
            return false;
        }
        rest = &rest[spec_end..];
    }
    true
}

/// The name of a built-in function (an OID below the first user object's), or None. A
/// syscache look-up, lighter than the guard's facts of a function: for telling at once
/// whether a call is one the rules here are about.
pub fn builtin_name(function: pg_sys::Oid) -> Option<String> {
    if function.to_u32() >= pg_sys::FirstNormalObjectId {
        return None;
    }
    // SAFETY: a catalog look-up; the name is copied before the palloc'd string goes with its
    // memory context.
    unsafe {
        let name = pg_sys::get_func_name(function);
        (!name.is_null()).then(|| CStr::from_ptr(name).to_string_lossy().into_owned())
    }
}

/// Bytes of a C function's symbol or library read at most.
const MAX_SOURCE_BYTES: usize = 4096;

/// The name a rule here knows `function` by: a built-in's own; for a function of `LANGUAGE
/// internal` that is not built in (only a superuser makes one: an extension's, such as
/// citext's `texticlike` behind its `~~*`), the name of the built-in whose C function it calls
/// (its `prosrc`: `textpos` is `position`'s), which works as the built-in does; for one of
/// `LANGUAGE c` (only a superuser makes one too), `module:symbol` (`ltree:ltxtq_exec`).
pub fn rule_name(function: pg_sys::Oid) -> Option<String> {
    if let Some(name) = builtin_name(function) {
        return Some(name);
    }
    let found = super::facts::Source::of_c_function(function, MAX_SOURCE_BYTES)?;
    let (language, source, library) = (found.language, found.source, found.library);
    let source = source?;
    match language {
        INTERNAL_LANGUAGE => {
            let source = std::ffi::CString::new(source).ok()?;
            // SAFETY: a look-up in the server's table of built-in C functions, by name.
            builtin_name(unsafe { pg_sys::fmgr_internal_function(source.as_ptr()) })
        }
        C_LANGUAGE => {
            // `$libdir/ltree` (or a path, with a suffix): the module's name.
            let library = library?;
            let file = library.rsplit('/').next().unwrap_or(&library);
            let module = file.split('.').next().unwrap_or(file);
            Some(format!("{module}:{source}"))
        }
        _ => None,
    }
}

/// Whether a rule here is about the built-in `name` (with any number of arguments).
pub fn has_rule(name: &str) -> bool {
    rule(name, 2).is_some()
}

/// Whether a rule here is about the built-in `name` called with `arguments` arguments.
pub fn has_rule_for(name: &str, arguments: usize) -> bool {
    rule(name, arguments).is_some()
}

/// The text of a constant of a built-in type, written out by its (built-in) output function;
/// None for anything else.
///
/// # Safety
/// `node` is an analysed expression, or null.
unsafe fn constant_text(node: *mut pg_sys::Node) -> Option<String> {
    // SAFETY: the caller's contract; the output function is a built-in type's.
    unsafe {
        let node = bare(node);
        let n = node.as_ref()?;
        if n.type_ != pg_sys::NodeTag::T_Const {
            return None;
        }
        let constant = node.cast::<pg_sys::Const>();
        if (*constant).constisnull || (*constant).consttype.to_u32() >= pg_sys::FirstNormalObjectId
        {
            return None;
        }
        let (mut output, mut varlena) = (pg_sys::InvalidOid, false);
        pg_sys::getTypeOutputInfo((*constant).consttype, &mut output, &mut varlena);
        let text = pg_sys::OidOutputFunctionCall(output, (*constant).constvalue);
        if text.is_null() {
            return None;
        }
        Some(CStr::from_ptr(text).to_string_lossy().into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_reads_the_document_once_when_it_names_it_at_its_start_only() {
        assert!(!reads_again("$.\"a\"[*]?(@.\"b\" > 1)"));
        assert!(!reads_again("strict $.a"));
        assert!(!reads_again("$.a[*]?(@.b[*] == \"x\")"));
        assert!(!reads_again("$.a[*][*].**?(@ > 1)"));
        assert!(!reads_again("$?(@.\"é\" == \"ü$@\\\"@\")"));
        assert!(!reads_again("$?(@.n like_regex \"^J.*\")"));
        assert!(reads_again("$[*] ? (@ == $[0])"));
        assert!(reads_again("$[*] ? (@ == $x)"));
        assert!(reads_again("$.a + $.b"));
        assert!(reads_again("$?(@[*] != @[*])"));
        assert!(reads_again("$?(@.\"a\" == @.\"b\")"));
        assert!(reads_again("$?(@.\"a\".abs() == @.\"b\")"));
        assert!(reads_again("$?(@.\"a\" == -@.\"b\")"));
        assert!(reads_again("$?(@.\"x(\" == @.\"b\")"));
        // As PostgreSQL writes paths out: filters as `?(`.
        assert!(reads_again("lax $?(exists (@[*]?(@.\"x\" == 1)))"));
    }

    #[test]
    fn the_rules_follow_the_functions_names_and_arities() {
        assert_eq!(rule("strpos", 2), Some(Rule::SmallConstant(1)));
        assert_eq!(rule("btrim", 1), None);
        assert_eq!(rule("btrim", 2), Some(Rule::SmallConstant(1)));
        assert_eq!(rule("arraycontains", 2), Some(Rule::EitherSmallConstant));
        assert_eq!(rule("jsonb_path_match_opr", 2), Some(Rule::ReadsOnce(1)));
        assert_eq!(rule("xmlexists", 2), Some(Rule::Never(XPATH)));
        assert_eq!(rule("jsonb_delete", 2), Some(Rule::SmallConstantArray(1)));
        assert_eq!(rule("bpchar", 3), Some(Rule::SmallCount(1)));
        assert_eq!(rule("bpchar", 1), None);
        assert_eq!(rule("polygon", 2), Some(Rule::SmallCount(0)));
        assert_eq!(rule("polygon", 1), None);
        assert!(matches!(rule("ts_rank", 3), Some(Rule::Never(_))));
        assert_eq!(rule("lpad", 3), Some(Rule::SmallCount(1)));
        assert_eq!(rule("format", 2), Some(Rule::SmallFormat(0)));
        assert_eq!(rule("length", 1), None);
    }

    #[test]
    fn a_format_field_is_narrow_when_its_width_is_small_and_written_out() {
        assert!(narrow_fields("%s: %I.%L, 100%% sure"));
        assert!(narrow_fields("%2$-10s|%1$10000s"));
        assert!(narrow_fields("price * quantity = %s"));
        assert!(!narrow_fields("%10001s"));
        assert!(!narrow_fields("%1$-1000000000s"));
        assert!(!narrow_fields("%*s"));
        assert!(!narrow_fields("%-*2$s"));
        assert!(!narrow_fields("%00000000000000000000001s"));
    }
}
