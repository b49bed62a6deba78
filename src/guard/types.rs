//! Fail closed on types as on functions. A value converted to or from a type runs that type's
//! code: its input and output functions (and with them a domain's CHECK expressions, a
//! composite's fields, an array's elements, a range's subtype), and the casts PostgreSQL looks
//! up while it runs (`to_jsonb` calls a type's cast to json). So every type a generated query
//! touches must be built in, or made only of what may run: built-in or allowed support and cast
//! functions, and CHECK expressions that pass the function policy. Refusals name the function.
//! The extension's own reads are stricter: only types that are built in, or domains over them.

use pgrx::pg_sys;

use std::collections::HashMap;
use std::rc::Rc;

use super::facts::{
    builtin, family_code, parts, stored_checks, type_holds, type_name, CacheList, FunctionFacts,
    TypeFacts, MAX_FAMILY_SUPPORT,
};
use super::policy::{self, Allowed};
use super::trust::{self, Trusted};
use super::verdict::Origin;

/// Types followed at most into the types they are made of.
const MAX_TYPE_DEPTH: usize = 16;

// pg_cast's castfunc and pg_range's columns, by attribute number (their headers are not in
// pgrx's bindings; build.rs reads the numbers from the server's).
use crate::compat::numbers::{
    ANUM_PG_CAST_CASTFUNC as ANUM_CAST_FUNC, ANUM_PG_RANGE_RNGCANONICAL as ANUM_RANGE_CANONICAL,
    ANUM_PG_RANGE_RNGCOLLATION as ANUM_RANGE_COLLATION,
    ANUM_PG_RANGE_RNGSUBDIFF as ANUM_RANGE_SUBDIFF,
    ANUM_PG_RANGE_RNGSUBOPC as ANUM_RANGE_SUBTYPE_OPCLASS,
};

/// What a type may be made of, for the SQL of `origin`.
pub struct TypePolicy {
    pub origin: Origin,
    pub allowed: Rc<Allowed>,
    pub allow_catalogs: bool,
    /// Set for a superuser's call: whose functions may run for it.
    pub trusted: Option<Trusted>,
}

/// Why values of `typ` may not be converted, remembered per type in `memo` (for one
/// statement). `check_expression` walks a domain's CHECK expression like the query itself and
/// says why it is refused.
///
pub fn refusal(
    policy: &TypePolicy,
    typ: pg_sys::Oid,
    memo: &mut HashMap<pg_sys::Oid, Option<String>>,
    check_expression: &mut dyn FnMut(*mut pg_sys::Node) -> Option<String>,
) -> Option<String> {
    Types {
        policy,
        memo,
        check_expression,
        inside: HashMap::new(),
    }
    .refusal(typ, 0)
}

/// Why converting a literal to `typ` may not run (see `ahead`): the CHECK of a domain inside it
/// (an array's element, a composite's field, a range's bound, at any depth), which its input
/// code runs, is refused by `check_expression`. A domain met directly is not checked here: its
/// CHECK runs only with the query, where the walk of the analyzed tree decides.
pub fn literal_refusal(
    policy: &TypePolicy,
    typ: pg_sys::Oid,
    check_expression: &mut dyn FnMut(*mut pg_sys::Node) -> Option<String>,
) -> Option<String> {
    let mut memo = HashMap::new();
    Types {
        policy,
        memo: &mut memo,
        check_expression,
        inside: HashMap::new(),
    }
    .inside(typ, false, 0)
}

/// The most (type, contained) pairs one literal's type is followed into: another role's types
/// may share their parts (60 columns of a type of 60 columns of a type ...), so each pair is
/// followed once, and so many at most.
const MAX_TYPE_PARTS: usize = 100_000;

struct Types<'a> {
    policy: &'a TypePolicy,
    memo: &'a mut HashMap<pg_sys::Oid, Option<String>>,
    check_expression: &'a mut dyn FnMut(*mut pg_sys::Node) -> Option<String>,
    /// `inside`'s answers, per type and whether it is contained.
    inside: HashMap<(pg_sys::Oid, bool), Option<String>>,
}

impl Types<'_> {
    /// Why values of `typ` may not be converted, remembered per type for this statement.
    fn refusal(&mut self, typ: pg_sys::Oid, depth: usize) -> Option<String> {
        if typ == pg_sys::InvalidOid || builtin(typ) {
            return None;
        }
        if let Some(known) = self.memo.get(&typ) {
            return known.clone();
        }
        let why = if depth > MAX_TYPE_DEPTH {
            Some("it is made of types nested too deeply to be checked".to_string())
        } else if self.policy.origin == Origin::Own {
            // SAFETY: a catalog look-up.
            let base = unsafe { pg_sys::getBaseType(typ) };
            (!builtin(base)).then(|| {
                "the extension reads on its own only built-in types and domains over them".into()
            })
        } else {
            self.generated_type_refusal(typ, depth)
        };
        self.memo.insert(typ, why.clone());
        why
    }

    /// `literal_refusal` of `typ`, `contained` in an array, a composite or a range, remembered
    /// (a type's parts are the same however deep it is met: no type contains itself).
    fn inside(&mut self, typ: pg_sys::Oid, contained: bool, depth: usize) -> Option<String> {
        if typ == pg_sys::InvalidOid || builtin(typ) {
            return None;
        }
        if let Some(known) = self.inside.get(&(typ, contained)) {
            return known.clone();
        }
        pgrx::check_for_interrupts!();
        let why = if self.inside.len() >= MAX_TYPE_PARTS {
            Some(format!(
                "the input code of {}, made of more types than can be checked",
                type_name(typ)
            ))
        } else {
            self.inside_unremembered(typ, contained, depth)
        };
        self.inside.insert((typ, contained), why.clone());
        why
    }

    fn inside_unremembered(
        &mut self,
        typ: pg_sys::Oid,
        contained: bool,
        depth: usize,
    ) -> Option<String> {
        if depth > MAX_TYPE_DEPTH {
            return Some(format!(
                "the input code of {}, made of types nested too deeply to be checked",
                type_name(typ)
            ));
        }
        let facts = TypeFacts::of(typ)?;
        let domain = facts.kind == pg_sys::TYPTYPE_DOMAIN;
        // A call converts no literal to a domain of a role it does not trust inside another
        // type, nor to a composite type of one (whose owner may give it a field of such a
        // domain), judged by its owner before analysis: a CHECK that is absent here may be
        // added before the literal's input code runs it, as the caller (a superuser's call, a
        // role's generated query, and the attempts of a view about to be saved alike). (A domain's
        // CHECK is the only code of another role that input runs: base types, their input
        // functions and ranges' canonical functions are a superuser's; an enum has no parts.)
        if (domain && contained) || facts.kind == pg_sys::TYPTYPE_COMPOSITE {
            if let Some(why) = self
                .policy
                .trusted
                .as_ref()
                .and_then(|t| t.refuse_owner(facts.owner, "type"))
            {
                return Some(format!("the input code of {}: {why}", type_name(typ)));
            }
        }
        if domain && contained {
            if let Some(why) = self.check_refusal(typ) {
                return Some(format!(
                    "the CHECK of domain {}, which a literal of it runs while the query is \
                     analysed, is refused: {why}",
                    type_name(typ)
                ));
            }
        }
        // A domain's base is met as the domain is; any other part is inside its type.
        parts(&facts)
            .into_iter()
            .find_map(|(part, _)| self.inside(part, contained || !domain, depth + 1))
    }

    fn generated_type_refusal(&mut self, typ: pg_sys::Oid, depth: usize) -> Option<String> {
        let Some(facts) = TypeFacts::of(typ) else {
            return Some("it is not in the catalog".into());
        };
        let made_of = |walk: &mut Types, part: pg_sys::Oid, what: &str| {
            walk.refusal(part, depth + 1)
                .map(|why| format!("its {what} {} is refused: {why}", type_name(part)))
        };
        // A superuser's call uses no type of a role it does not trust: its owner may change it
        // (a domain's CHECK added, say) once a saved view or a query uses it.
        if let Some(why) = self
            .policy
            .trusted
            .as_ref()
            .and_then(|t| t.refuse_owner(facts.owner, "type"))
        {
            return Some(why);
        }
        if let Some(why) = collations(&facts).into_iter().find_map(|collation| {
            trust::collation_refusal(collation).map(|why| {
                format!(
                    "its collation {} is refused: {why}",
                    trust::collation_name(collation)
                )
            })
        }) {
            return Some(why);
        }
        if let Some(why) = self.support_refusal(&facts.support, "input, output or support") {
            return Some(why);
        }
        if let Some(why) = self.cast_refusal(typ) {
            return Some(why);
        }
        if let Some(why) = parts(&facts)
            .into_iter()
            .find_map(|(part, what)| made_of(self, part, what))
        {
            return Some(why);
        }
        match facts.kind {
            pg_sys::TYPTYPE_DOMAIN => self.domain_check_refusal(typ),
            // A range compares its bounds with its subtype's operator class (through the type
            // cache, where no gate sees the call): that family's support functions too.
            pg_sys::TYPTYPE_RANGE => self
                .support_refusal(&range_functions(typ), "range")
                .or_else(|| match range_subtype_support(typ) {
                    Some(functions) => self.support_refusal(&functions, "subtype operator class's"),
                    None => Some(format!(
                        "its subtype's operator family has more than {MAX_FAMILY_SUPPORT} \
                         support functions or member operators"
                    )),
                }),
            _ => None,
        }
        // Its default btree and hash classes, which compare its values wherever it is sorted,
        // grouped, hashed or met in GREATEST, LEAST, a row or an array comparison.
        .or_else(|| match default_class_code(typ) {
            Some(functions) => self.support_refusal(&functions, "default operator class's"),
            None => Some(format!(
                "a default operator family of it has more than {MAX_FAMILY_SUPPORT} support \
                 functions or member operators"
            )),
        })
    }

    /// Why a superuser's call may not run `facts`' function: another role owns it.
    fn owner_refusal(&self, facts: &FunctionFacts) -> Option<String> {
        self.policy
            .trusted
            .as_ref()
            .filter(|t| t.judges_code())
            .and_then(|t| t.refuse_owner(facts.owner, "function"))
    }

    /// The first of `functions` that may not run implicitly for a type.
    fn support_refusal(&self, functions: &[pg_sys::Oid], what: &str) -> Option<String> {
        functions.iter().find_map(|&function| {
            if builtin(function) {
                return None;
            }
            let facts = FunctionFacts::of(function)?;
            policy::refuse_support(&facts.policy(), &self.policy.allowed)
                .or_else(|| self.owner_refusal(&facts))
                .map(|why| {
                    format!(
                        "its {what} function {} is not allowed: {why}",
                        FunctionFacts::signature(function)
                    )
                })
        })
    }

    /// Casts from `typ` that call a function: PostgreSQL may look one up while it runs (a cast
    /// to json inside `to_jsonb`), so each must pass the function policy.
    fn cast_refusal(&mut self, typ: pg_sys::Oid) -> Option<String> {
        let cache = pg_sys::SysCacheIdentifier::CASTSOURCETARGET;
        // SAFETY: the first key of CASTSOURCETARGET is the source type's OID.
        let list = unsafe { CacheList::search(cache, pg_sys::Datum::from(typ)) };
        let functions: Vec<pg_sys::Oid> = list
            .tuples()
            .into_iter()
            .filter_map(|tuple| {
                let mut is_null = true;
                // SAFETY: a pg_cast tuple of the held list, read through its cache.
                let datum = unsafe {
                    pg_sys::SysCacheGetAttr(cache as i32, tuple, ANUM_CAST_FUNC, &mut is_null)
                };
                let function = pg_sys::Oid::from(datum.value() as u32);
                (!is_null && function != pg_sys::InvalidOid).then_some(function)
            })
            .collect();
        functions.into_iter().find_map(|function| {
            if builtin(function) {
                return None;
            }
            let facts = FunctionFacts::of(function)?;
            policy::refuse(
                &facts.policy(),
                &self.policy.allowed,
                self.policy.allow_catalogs,
            )
            .or_else(|| self.owner_refusal(&facts))
            .map(|why| {
                format!(
                    "its cast function {} is not allowed: {why}",
                    FunctionFacts::signature(function)
                )
            })
        })
    }

    /// The domain's CHECK expressions, walked like the query itself.
    fn domain_check_refusal(&mut self, domain: pg_sys::Oid) -> Option<String> {
        self.check_refusal(domain)
            .map(|why| format!("its CHECK constraint is refused: {why}"))
    }

    /// Why one of the domain's CHECK expressions is refused, walked like the query itself.
    fn check_refusal(&mut self, domain: pg_sys::Oid) -> Option<String> {
        // SAFETY: a catalog scan of the current transaction.
        let expressions = unsafe { stored_checks(domain) };
        expressions
            .into_iter()
            .find_map(|expression| (self.check_expression)(expression))
    }
}

/// The support functions of the operator family of `range`'s subtype operator class (what
/// compares its bounds); `None` past `MAX_FAMILY_SUPPORT`.
fn range_subtype_support(range: pg_sys::Oid) -> Option<Vec<pg_sys::Oid>> {
    let cache = pg_sys::SysCacheIdentifier::RANGETYPE as i32;
    // SAFETY: a syscache look-up, released before returning.
    let opclass = unsafe {
        let tuple = pg_sys::SearchSysCache1(cache, pg_sys::Datum::from(range));
        if tuple.is_null() {
            return Some(Vec::new());
        }
        let mut is_null = true;
        let datum = pg_sys::SysCacheGetAttr(cache, tuple, ANUM_RANGE_SUBTYPE_OPCLASS, &mut is_null);
        let opclass = pg_sys::Oid::from(datum.value() as u32);
        pg_sys::ReleaseSysCache(tuple);
        if is_null {
            return Some(Vec::new());
        }
        opclass
    };
    // SAFETY: a catalog look-up of the operator class the range names (which it depends on:
    // the class cannot be dropped while the range exists).
    let family = unsafe { pg_sys::get_opclass_family(opclass) };
    if family == pg_sys::InvalidOid {
        return Some(Vec::new());
    }
    family_code(family)
}

/// What the default btree and hash operator classes of `typ` run (`family_code`): PostgreSQL
/// finds them through the type cache to sort, group, hash, compare rows and arrays of it and
/// evaluate GREATEST and LEAST, where no gate sees the call; `None` past the bounds.
fn default_class_code(typ: pg_sys::Oid) -> Option<Vec<pg_sys::Oid>> {
    let mut functions = Vec::new();
    for method in [pg_sys::BTREE_AM_OID, pg_sys::HASH_AM_OID] {
        // SAFETY: catalog look-ups of the type's default class for an access method and of
        // that class's family (InvalidOid where there is none).
        let family = unsafe {
            let class = pg_sys::GetDefaultOpClass(typ, method);
            if class == pg_sys::InvalidOid {
                continue;
            }
            pg_sys::get_opclass_family(class)
        };
        if family != pg_sys::InvalidOid {
            functions.extend(family_code(family)?);
        }
    }
    Some(functions)
}

/// The collations a value of the type compares with: a domain's, a composite type's fields'
/// (not a table's row type's), a range's (its bounds are compared as a literal of it is read).
fn collations(facts: &TypeFacts) -> Vec<pg_sys::Oid> {
    let mut found = vec![facts.collation];
    // SAFETY: catalog look-ups; the syscache entry is released again.
    unsafe {
        // A table's row type compares its columns with their collations, the table owner's
        // choice like the columns themselves; a composite type's fields, its owner's.
        if facts.relation != pg_sys::InvalidOid
            && pg_sys::get_rel_relkind(facts.relation) as u8 == pg_sys::RELKIND_COMPOSITE_TYPE
        {
            let fields = super::facts::row_attributes(facts.oid).unwrap_or_default();
            found.extend(fields.into_iter().map(|(_, collation)| collation));
        }
        if facts.kind == pg_sys::TYPTYPE_RANGE {
            let cache = pg_sys::SysCacheIdentifier::RANGETYPE as i32;
            let tuple = pg_sys::SearchSysCache1(cache, pg_sys::Datum::from(facts.oid));
            if !tuple.is_null() {
                let mut is_null = true;
                let datum =
                    pg_sys::SysCacheGetAttr(cache, tuple, ANUM_RANGE_COLLATION, &mut is_null);
                if !is_null {
                    found.push(pg_sys::Oid::from(datum.value() as u32));
                }
                pg_sys::ReleaseSysCache(tuple);
            }
        }
    }
    found.retain(|c| *c != pg_sys::InvalidOid);
    found
}

/// A range type's canonical and subtype-difference functions.
fn range_functions(range: pg_sys::Oid) -> Vec<pg_sys::Oid> {
    let cache = pg_sys::SysCacheIdentifier::RANGETYPE as i32;
    // SAFETY: a syscache look-up, released before returning.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(cache, pg_sys::Datum::from(range));
        if tuple.is_null() {
            return Vec::new();
        }
        let functions = [ANUM_RANGE_CANONICAL, ANUM_RANGE_SUBDIFF]
            .into_iter()
            .filter_map(|attribute| {
                let mut is_null = true;
                let datum = pg_sys::SysCacheGetAttr(cache, tuple, attribute, &mut is_null);
                let function = pg_sys::Oid::from(datum.value() as u32);
                (!is_null && function != pg_sys::InvalidOid).then_some(function)
            })
            .collect();
        pg_sys::ReleaseSysCache(tuple);
        functions
    }
}

/// Built-in types whose text is looked up in the catalog, value by value (`regclass` writes a
/// relation's name, `aclitem` its roles'). An array of them is written out by one call that
/// checks no interrupt between its elements, and a catalog cache bucket another call filled
/// with the entries of OIDs that hash alike (some 65,000 of them) makes each look-up walk them
/// all: a few million elements keep the backend deaf to cancel for minutes, in flat memory.
const LOOKED_UP: [pg_sys::Oid; 12] = [
    pg_sys::REGPROCOID,
    pg_sys::REGPROCEDUREOID,
    pg_sys::REGOPEROID,
    pg_sys::REGOPERATOROID,
    pg_sys::REGCLASSOID,
    pg_sys::REGTYPEOID,
    pg_sys::REGCONFIGOID,
    pg_sys::REGDICTIONARYOID,
    pg_sys::REGROLEOID,
    pg_sys::REGNAMESPACEOID,
    pg_sys::REGCOLLATIONOID,
    pg_sys::ACLITEMOID,
];

/// Whether `typ` (a base type) is written by looking each value up in the catalog
/// (`LOOKED_UP`).
pub fn is_looked_up(typ: pg_sys::Oid) -> bool {
    LOOKED_UP.contains(&typ)
}

/// Whether values of `typ` hold values written by catalog look-ups inside another value (an
/// array, a row, a range): many looked up by one call (`LOOKED_UP`).
pub fn holds_looked_up(typ: pg_sys::Oid) -> bool {
    if typ == pg_sys::InvalidOid {
        return false;
    }
    // Most types of a query: built-in scalars and their arrays, answered without a look-up.
    if builtin(typ) && typ.to_u32() < pg_sys::FirstGenbkiObjectId {
        // SAFETY: a catalog look-up of a built-in type.
        let element = unsafe { pg_sys::get_element_type(typ) };
        // A scalar that is no row, or an array of a looked-up scalar (an array of a catalog's
        // row type, `pg_class[]`, holds `aclitem[]` and `regproc` fields: walked below).
        // SAFETY: as above.
        let row = |t: pg_sys::Oid| unsafe { pg_sys::get_typtype(t) } as u8 == b'c';
        if element == pg_sys::InvalidOid && !row(typ) {
            return false;
        }
        if element != pg_sys::InvalidOid && !row(element) {
            return is_looked_up(element);
        }
    }
    type_holds(typ, &|base, nested| nested && is_looked_up(base))
}

/// Types whose values name code: converting text to one runs the named type's modifier input
/// function (`regtype`, and the argument types of `regprocedure` and `regoperator`), and a text
/// search function given one runs the configuration's parser and dictionaries.
const CODE_NAMING: [pg_sys::Oid; 5] = [
    pg_sys::REGTYPEOID,
    pg_sys::REGPROCEDUREOID,
    pg_sys::REGOPERATOROID,
    pg_sys::REGCONFIGOID,
    pg_sys::REGDICTIONARYOID,
];

/// Whether `typ` itself is one of the types that name code (not a record or array of one).
pub fn is_code_naming(typ: pg_sys::Oid) -> bool {
    CODE_NAMING.contains(&typ)
}

/// Whether values of `typ` are or hold (through domains, arrays, named composites, ranges and
/// multiranges) values that name code (`CODE_NAMING`).
pub fn names_code(typ: pg_sys::Oid) -> bool {
    if CODE_NAMING.contains(&typ) {
        return true;
    }
    // Most types of a query: built-in scalars, answered without a look-up.
    if builtin(typ) && typ.to_u32() < pg_sys::FirstGenbkiObjectId {
        // SAFETY: a catalog look-up of a built-in type.
        let element = unsafe { pg_sys::get_element_type(typ) };
        return CODE_NAMING.contains(&element);
    }
    type_holds(typ, &|base, _| CODE_NAMING.contains(&base))
}
