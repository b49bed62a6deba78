//! What the guard's policies need to know about catalog objects, looked up by OID.

use pgrx::pg_sys;

use super::policy;
use crate::names::{c_string, namespace_name};

/// A relation held open, closed when dropped (also when an ERROR unwinds past it); the lock it
/// was opened with stays until the transaction ends.
pub struct OpenRelation(pub pg_sys::Relation);

impl OpenRelation {
    /// Opens `relation` with `lock` (`NoLock` for one this transaction has locked already).
    ///
    /// # Safety
    /// `relation` must exist; with `NoLock`, this transaction must hold a lock on it.
    pub unsafe fn open(relation: pg_sys::Oid, lock: u32) -> OpenRelation {
        // SAFETY: the caller's contract; `relation_open` raises an ERROR for a relation that
        // is gone, and never returns null.
        OpenRelation(unsafe { pg_sys::relation_open(relation, lock as pg_sys::LOCKMODE) })
    }
}

impl Drop for OpenRelation {
    fn drop(&mut self) {
        // SAFETY: opened by `OpenRelation::open` and closed exactly once, here.
        unsafe { pg_sys::relation_close(self.0, pg_sys::NoLock as pg_sys::LOCKMODE) }
    }
}

/// The tuples of a syscache list search on its first key, released when dropped (also when an
/// ERROR unwinds past it).
pub struct CacheList(*mut pg_sys::CatCList);

impl CacheList {
    /// The members of `cache` whose first key is `key`.
    ///
    /// # Safety
    /// `key` must be a Datum of the type of the cache's first key (a NUL-terminated string
    /// for a name).
    pub unsafe fn search(cache: pg_sys::SysCacheIdentifier::Type, key: pg_sys::Datum) -> Self {
        // SAFETY: the caller's contract; the list is released by `drop`.
        CacheList(unsafe {
            pg_sys::SearchSysCacheList(
                cache as i32,
                1,
                key,
                pg_sys::Datum::from(0usize),
                pg_sys::Datum::from(0usize),
            )
        })
    }

    /// The list's tuples, of the catalog the cache covers (valid while the list is held).
    pub fn tuples(&self) -> Vec<pg_sys::HeapTuple> {
        if self.0.is_null() {
            return Vec::new();
        }
        // SAFETY: a list the syscache returned, with `n_members` catcache entries, held until
        // drop.
        unsafe {
            (*self.0)
                .members
                .as_slice((*self.0).n_members as usize)
                .iter()
                .map(|&member| &mut (*member).tuple as pg_sys::HeapTuple)
                .collect()
        }
    }
}

impl Drop for CacheList {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: searched by `CacheList::search` and released exactly once, here.
            unsafe { pg_sys::ReleaseCatCacheList(self.0) }
        }
    }
}

/// `schema.name(left,right)` of `operator`, as messages name it (its OID when the name another
/// role chose would not print on one line).
pub fn operator_name(operator: pg_sys::Oid) -> String {
    // SAFETY: a catalog look-up; the text is a palloc'd copy.
    let name = unsafe { c_string(pg_sys::format_operator(operator)) };
    if crate::names::printable(&name) {
        name
    } else {
        format!("{operator}")
    }
}

/// The owner of `operator` (InvalidOid for one that is gone, which no role is trusted as).
pub fn operator_owner(operator: pg_sys::Oid) -> pg_sys::Oid {
    // SAFETY: a syscache look-up, released before returning.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::OPEROID as i32,
            pg_sys::Datum::from(operator),
        );
        if tuple.is_null() {
            return pg_sys::InvalidOid;
        }
        let owner =
            (*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_operator>(tuple)).oprowner;
        pg_sys::ReleaseSysCache(tuple);
        owner
    }
}

/// Operators followed from one through commutators and negators, at most (a pair each, most
/// often: `=` and `<>`, `<` and `>`).
pub const MAX_LINKED_OPERATORS: usize = 16;

/// `operator` and every operator linked to it as its commutator or negator, however far (the
/// planner may put any of them in its place), or None past `MAX_LINKED_OPERATORS`.
pub fn linked_operators(operator: pg_sys::Oid) -> Option<Vec<pg_sys::Oid>> {
    let (mut seen, mut next) = (Vec::new(), vec![operator]);
    while let Some(operator) = next.pop() {
        if operator == pg_sys::InvalidOid || seen.contains(&operator) {
            continue;
        }
        seen.push(operator);
        if seen.len() > MAX_LINKED_OPERATORS {
            return None;
        }
        // SAFETY: catalog look-ups (InvalidOid for none, or one that is gone).
        next.extend(unsafe {
            [
                pg_sys::get_commutator(operator),
                pg_sys::get_negator(operator),
            ]
        });
    }
    Some(seen)
}

/// Objects with OIDs below this were created by initdb.
pub fn builtin(oid: pg_sys::Oid) -> bool {
    oid.to_u32() < pg_sys::FirstNormalObjectId
}

/// What the function policy needs to know about one function, from pg_proc.
pub struct FunctionFacts {
    schema: String,
    name: String,
    volatility: u8,
    /// Created by initdb in pg_catalog.
    pub builtin: bool,
    extension: Option<String>,
    type_support: bool,
    returns_nothing: bool,
    pub owner: pg_sys::Oid,
    /// Its schema's owner (the database's owner for a schema `pg_database_owner` owns).
    schema_owner: pg_sys::Oid,
    /// An aggregate, whose support functions run for it.
    pub aggregate: bool,
    /// An event trigger's function: it runs only for the DDL of an event trigger, which only
    /// a superuser creates.
    pub event_trigger: bool,
}

impl FunctionFacts {
    /// The facts of `function`, `None` when it is not in the catalog.
    pub fn of(function: pg_sys::Oid) -> Option<FunctionFacts> {
        // SAFETY: syscache look-ups, each released before returning.
        unsafe {
            let tuple = pg_sys::SearchSysCache1(
                pg_sys::SysCacheIdentifier::PROCOID as i32,
                pg_sys::Datum::from(function),
            );
            if tuple.is_null() {
                return None;
            }
            let form = pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_proc>(tuple);
            let internal = |t: pg_sys::Oid| {
                t == pg_sys::CSTRINGOID || t == pg_sys::CSTRINGARRAYOID || t == pg_sys::INTERNALOID
            };
            let arguments = &(*form).proargtypes;
            let type_support = internal((*form).prorettype)
                || arguments
                    .values
                    .as_slice(arguments.dim1.max(0) as usize)
                    .iter()
                    .any(|t| internal(*t));
            let namespace = (*form).pronamespace;
            let facts = FunctionFacts {
                schema: namespace_name(namespace).unwrap_or_default(),
                name: c_string((*form).proname.data.as_ptr()),
                volatility: (*form).provolatile as u8,
                builtin: builtin(function) && namespace.to_u32() == pg_sys::PG_CATALOG_NAMESPACE,
                extension: None,
                type_support,
                returns_nothing: [
                    pg_sys::VOIDOID,
                    pg_sys::TRIGGEROID,
                    pg_sys::EVENT_TRIGGEROID,
                    pg_sys::LANGUAGE_HANDLEROID,
                    pg_sys::FDW_HANDLEROID,
                    pg_sys::INDEX_AM_HANDLEROID,
                    pg_sys::TABLE_AM_HANDLEROID,
                    pg_sys::TSM_HANDLEROID,
                ]
                .contains(&(*form).prorettype),
                owner: (*form).proowner,
                schema_owner: schema_owner(namespace),
                aggregate: (*form).prokind as u8 == b'a',
                event_trigger: (*form).prorettype == pg_sys::EVENT_TRIGGEROID,
            };
            pg_sys::ReleaseSysCache(tuple);
            let extension_oid = pg_sys::getExtensionOfObject(pg_sys::ProcedureRelationId, function);
            Some(FunctionFacts {
                extension: (extension_oid != pg_sys::InvalidOid)
                    .then(|| c_string(pg_sys::get_extension_name(extension_oid))),
                ..facts
            })
        }
    }

    pub fn policy(&self) -> policy::Function<'_> {
        // A built-in is the bootstrap superuser's; any other owner is looked up.
        // SAFETY: looks up the owner's role (a syscache read).
        let superuser_owned = self.builtin || unsafe { pg_sys::superuser_arg(self.owner) };
        policy::Function {
            schema: &self.schema,
            name: &self.name,
            volatility: self.volatility,
            builtin: self.builtin,
            extension: self.extension.as_deref(),
            superuser_owned,
            nameable: superuser_owned
                || self.owner == self.schema_owner
                || trusted_owners().contains(&self.owner),
            type_support: self.type_support,
            returns_nothing: self.returns_nothing,
        }
    }

    /// Its name, without its schema.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether a superuser owns it.
    pub fn superuser_owned(&self) -> bool {
        // SAFETY: a catalog look-up of a role's attributes.
        unsafe { pg_sys::superuser_arg(self.owner) }
    }

    /// The extension it belongs to, if any.
    pub fn extension(&self) -> Option<&str> {
        self.extension.as_deref()
    }

    /// `schema.name(argument types)`, as a refusal names it.
    pub fn signature(function: pg_sys::Oid) -> String {
        // SAFETY: formats a function that exists (its facts were just read).
        unsafe { c_string(pg_sys::format_procedure_qualified(function)) }
    }
}

/// The roles `sql_query_engine.trusted_owners` names that exist.
pub fn trusted_owners() -> Vec<pg_sys::Oid> {
    crate::settings::trusted_owners()
        .iter()
        .filter_map(|name| std::ffi::CString::new(name.as_str()).ok())
        // SAFETY: a NUL-terminated name; a role that does not exist is skipped.
        .map(|name| unsafe { pg_sys::get_role_oid(name.as_ptr(), true) })
        .filter(|oid| *oid != pg_sys::InvalidOid)
        .collect()
}

/// The owner of schema `namespace`: the database's owner for one `pg_database_owner` owns
/// (`public` since PostgreSQL 15); `InvalidOid` for one that is gone.
fn schema_owner(namespace: pg_sys::Oid) -> pg_sys::Oid {
    // SAFETY: a syscache look-up, released before returning; the database's owner is read
    // from the catalog of the database the backend is connected to.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::NAMESPACEOID as i32,
            pg_sys::Datum::from(namespace),
        );
        if tuple.is_null() {
            return pg_sys::InvalidOid;
        }
        let owner =
            (*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_namespace>(tuple)).nspowner;
        pg_sys::ReleaseSysCache(tuple);
        if owner != pg_sys::Oid::from(pg_sys::ROLE_PG_DATABASE_OWNER) {
            return owner;
        }
        let database = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::DATABASEOID as i32,
            pg_sys::Datum::from(pg_sys::MyDatabaseId),
        );
        if database.is_null() {
            return pg_sys::InvalidOid;
        }
        let dba = (*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_database>(database)).datdba;
        pg_sys::ReleaseSysCache(database);
        dba
    }
}

/// Support functions, and member operators, of one operator family read, at most.
pub const MAX_FAMILY_SUPPORT: usize = 1024;

/// What the operator family `family` runs out of any tree's sight: its support functions
/// (comparison, sort support, hashing, `in_range`) and the functions and planner estimators of
/// its member operators and of their commutators and negators (the planner derives join
/// clauses with them, costs merge joins by calling them on column statistics, and Memoize and
/// GREATEST compare with them); `None` past `MAX_FAMILY_SUPPORT` of either.
pub fn family_code(family: pg_sys::Oid) -> Option<Vec<pg_sys::Oid>> {
    let mut functions = family_support(family)?;
    // SAFETY: the first key of AMOPSTRATEGY is the family's OID.
    let list = unsafe {
        CacheList::search(
            pg_sys::SysCacheIdentifier::AMOPSTRATEGY,
            pg_sys::Datum::from(family),
        )
    };
    let tuples = list.tuples();
    if tuples.len() > MAX_FAMILY_SUPPORT {
        return None;
    }
    for tuple in tuples {
        let operator = {
            // SAFETY: a pg_amop tuple of the held list.
            unsafe { (*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_amop>(tuple)).amopopr }
        };
        functions.extend(operator_code(operator));
        // The planner commutes the clauses it derives with them (merge and hash joins), and
        // a negator can be linked to an operator after the family was made.
        // SAFETY: syscache look-ups by OID (InvalidOid for none).
        let linked = unsafe {
            [
                pg_sys::get_commutator(operator),
                pg_sys::get_negator(operator),
            ]
        };
        for other in linked.into_iter().filter(|o| *o != pg_sys::InvalidOid) {
            functions.extend(operator_code(other));
        }
    }
    functions.retain(|f| *f != pg_sys::InvalidOid);
    functions.sort_unstable_by_key(|f| f.to_u32());
    functions.dedup();
    Some(functions)
}

/// What calling `operator` runs: its function and the planner's restriction and join
/// estimators (`InvalidOid` where it has none, or is gone).
pub fn operator_code(operator: pg_sys::Oid) -> [pg_sys::Oid; 3] {
    // SAFETY: syscache look-ups by OID; each gives InvalidOid for an operator that is gone.
    unsafe {
        [
            pg_sys::get_opcode(operator),
            pg_sys::get_oprrest(operator),
            pg_sys::get_oprjoin(operator),
        ]
    }
}

/// The support functions of the operator family `family`; `None` past `MAX_FAMILY_SUPPORT`.
fn family_support(family: pg_sys::Oid) -> Option<Vec<pg_sys::Oid>> {
    // SAFETY: the first key of AMPROCNUM is the family's OID.
    let list = unsafe {
        CacheList::search(
            pg_sys::SysCacheIdentifier::AMPROCNUM,
            pg_sys::Datum::from(family),
        )
    };
    let tuples = list.tuples();
    (tuples.len() <= MAX_FAMILY_SUPPORT).then(|| {
        tuples
            .into_iter()
            // SAFETY: pg_amproc tuples of the held list.
            .map(|tuple| unsafe {
                (*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_amproc>(tuple)).amproc
            })
            .collect()
    })
}

/// The types of the fields of the named row type `typ`, dropped columns left out; `None` for a
/// type that is no row type (or an anonymous record's).
pub fn row_fields(typ: pg_sys::Oid) -> Option<Vec<pg_sys::Oid>> {
    row_attributes(typ).map(|fields| fields.into_iter().map(|(typ, _)| typ).collect())
}

/// The type and collation of each field of the named row type `typ`, dropped columns left
/// out; `None` for a type that is no row type (or an anonymous record's).
pub fn row_attributes(typ: pg_sys::Oid) -> Option<Vec<(pg_sys::Oid, pg_sys::Oid)>> {
    // SAFETY: catalog look-ups; the row type's descriptor is released again.
    unsafe {
        if !pg_sys::type_is_rowtype(typ) || typ == pg_sys::RECORDOID {
            return None;
        }
        let desc = pg_sys::lookup_rowtype_tupdesc_noerror(typ, -1, true);
        if desc.is_null() {
            return None;
        }
        let fields = crate::compat::attributes(desc)
            .iter()
            .filter(|a| !a.attisdropped)
            .map(|a| (a.atttypid, a.attcollation))
            .collect();
        crate::compat::release_tuple_desc(desc);
        Some(fields)
    }
}

/// Whether a value of `typ` holds (through domains, arrays, named composites, ranges and
/// multiranges) a part `wanted` says yes to (given the part's base type, and whether it is
/// inside another value).
pub fn type_holds(typ: pg_sys::Oid, wanted: &dyn Fn(pg_sys::Oid, bool) -> bool) -> bool {
    holds_below(typ, false, 0, wanted, &mut std::collections::HashMap::new())
}

/// `type_holds` below `depth`, `nested` when inside another value, each type answered once
/// (`known`).
fn holds_below(
    typ: pg_sys::Oid,
    nested: bool,
    depth: usize,
    wanted: &dyn Fn(pg_sys::Oid, bool) -> bool,
    known: &mut std::collections::HashMap<(pg_sys::Oid, bool), bool>,
) -> bool {
    if let Some(answer) = known.get(&(typ, nested)) {
        return *answer;
    }
    pgrx::check_for_interrupts!();
    // SAFETY: catalog look-ups of a type a query has.
    let (base, parts) = unsafe {
        let base = pg_sys::getBaseType(typ);
        let element = pg_sys::get_element_type(base);
        let parts = match pg_sys::get_typtype(base) as u8 {
            _ if element != pg_sys::InvalidOid => Some(vec![element]),
            b'r' => Some(vec![pg_sys::get_range_subtype(base)]),
            b'm' => Some(vec![pg_sys::get_multirange_range(base)]),
            _ => row_fields(base),
        };
        (base, parts)
    };
    let answer = if wanted(base, nested) {
        true
    } else if depth > 8 {
        // Deeper than any type walk goes: yes, to be safe.
        true
    } else {
        parts.is_some_and(|parts| {
            parts
                .into_iter()
                .filter(|part| *part != pg_sys::InvalidOid)
                .any(|part| holds_below(part, true, depth + 1, wanted, known))
        })
    };
    known.insert((typ, nested), answer);
    answer
}

/// What a type is made of, from pg_type.
pub struct TypeFacts {
    pub oid: pg_sys::Oid,
    pub kind: u8,
    pub owner: pg_sys::Oid,
    pub base: pg_sys::Oid,
    pub relation: pg_sys::Oid,
    /// A domain's or a collatable base type's collation.
    pub collation: pg_sys::Oid,
    pub support: Vec<pg_sys::Oid>,
}

impl TypeFacts {
    pub fn of(typ: pg_sys::Oid) -> Option<TypeFacts> {
        // SAFETY: a syscache look-up, released before returning.
        unsafe {
            let tuple = pg_sys::SearchSysCache1(
                pg_sys::SysCacheIdentifier::TYPEOID as i32,
                pg_sys::Datum::from(typ),
            );
            if tuple.is_null() {
                return None;
            }
            let form = pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_type>(tuple);
            let facts = TypeFacts {
                oid: typ,
                kind: (*form).typtype as u8,
                owner: (*form).typowner,
                base: (*form).typbasetype,
                relation: (*form).typrelid,
                collation: (*form).typcollation,
                support: [
                    (*form).typinput,
                    (*form).typoutput,
                    (*form).typreceive,
                    (*form).typsend,
                    (*form).typmodin,
                    (*form).typmodout,
                    (*form).typanalyze,
                    (*form).typsubscript,
                ]
                .into_iter()
                .filter(|f| *f != pg_sys::InvalidOid)
                .collect(),
            };
            pg_sys::ReleaseSysCache(tuple);
            Some(facts)
        }
    }
}

/// How a function runs, as `pg_proc` says: its language and the texts of its source
/// (`prosrc`: a C function's symbol, or a body), its library (`probin`) and its stored
/// SQL-standard body (`prosqlbody`), each None when null or longer than `max_bytes` (measured
/// before it is decompressed or copied: `too_long` says so).
pub struct Source {
    pub language: u32,
    pub source: Option<String>,
    pub library: Option<String>,
    pub standard_body: Option<String>,
    pub too_long: bool,
}

/// The OIDs of `LANGUAGE internal` and `LANGUAGE c` (`pg_language.dat`, the same in every
/// release): their source is a C function's symbol, not a body.
pub const INTERNAL_LANGUAGE: u32 = 12;
pub const C_LANGUAGE: u32 = 13;

impl Source {
    /// The source of `function` when it is a C function (of `LANGUAGE internal` or `c`), its
    /// texts at most `max_bytes`; only its language for any other. None when it is not in the
    /// catalog.
    pub fn of_c_function(function: pg_sys::Oid, max_bytes: usize) -> Option<Source> {
        Source::read(function, max_bytes, |language| {
            language == INTERNAL_LANGUAGE || language == C_LANGUAGE
        })
    }

    /// The source of `function` when its body is text (SQL, PL/pgSQL, ...), its texts at most
    /// `max_bytes`; only its language for a C function. None when it is not in the catalog.
    pub fn of_body(function: pg_sys::Oid, max_bytes: usize) -> Option<Source> {
        Source::read(function, max_bytes, |language| {
            language != INTERNAL_LANGUAGE && language != C_LANGUAGE
        })
    }

    /// The source of `function`, its texts copied only when `wanted` says so of its language
    /// (a call's function is read at every call node: a body is copied only where it is read).
    fn read(
        function: pg_sys::Oid,
        max_bytes: usize,
        wanted: impl Fn(u32) -> bool,
    ) -> Option<Source> {
        // SAFETY: a syscache look-up, released before returning; the texts are copied out of
        // the tuple before the release.
        unsafe {
            let tuple = pg_sys::SearchSysCache1(
                pg_sys::SysCacheIdentifier::PROCOID as i32,
                pg_sys::Datum::from(function),
            );
            if tuple.is_null() {
                return None;
            }
            let form = pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_proc>(tuple);
            let language = (*form).prolang.to_u32();
            let copied = wanted(language);
            let mut too_long = false;
            let mut text_of = |attribute: u32| {
                if !copied {
                    return None;
                }
                let mut null = true;
                let datum = pg_sys::SysCacheGetAttr(
                    pg_sys::SysCacheIdentifier::PROCOID as i32,
                    tuple,
                    attribute as pg_sys::AttrNumber,
                    &mut null,
                );
                if null {
                    return None;
                }
                if pg_sys::toast_raw_datum_size(datum) > max_bytes {
                    too_long = true;
                    return None;
                }
                let text = pg_sys::text_to_cstring(datum.cast_mut_ptr());
                let copied = std::ffi::CStr::from_ptr(text)
                    .to_string_lossy()
                    .into_owned();
                pg_sys::pfree(text.cast());
                Some(copied)
            };
            let (source, library, standard_body) = (
                text_of(pg_sys::Anum_pg_proc_prosrc),
                text_of(pg_sys::Anum_pg_proc_probin),
                text_of(pg_sys::Anum_pg_proc_prosqlbody),
            );
            let found = Source {
                language,
                source,
                library,
                standard_body,
                too_long,
            };
            pg_sys::ReleaseSysCache(tuple);
            Some(found)
        }
    }
}

/// `typ` as SQL writes it, schema-qualified.
pub fn type_name(typ: pg_sys::Oid) -> String {
    // SAFETY: formats an OID; an unknown one comes back as "???" rather than an error.
    unsafe {
        crate::names::c_string(pg_sys::format_type_extended(
            typ,
            -1,
            (pg_sys::FORMAT_TYPE_ALLOW_INVALID | pg_sys::FORMAT_TYPE_FORCE_QUALIFY) as u16,
        ))
    }
}

/// The types a value of a type is made of, and what each is to it: a domain's base type, a
/// composite's field types, a range's subtype, a multirange's range type, an array's element
/// type.
pub fn parts(facts: &TypeFacts) -> Vec<(pg_sys::Oid, &'static str)> {
    // SAFETY: catalog look-ups.
    unsafe {
        match facts.kind {
            pg_sys::TYPTYPE_DOMAIN => vec![(facts.base, "base type")],
            pg_sys::TYPTYPE_COMPOSITE => composite_fields(facts.relation)
                .into_iter()
                .map(|field| (field, "field type"))
                .collect(),
            pg_sys::TYPTYPE_RANGE => vec![(pg_sys::get_range_subtype(facts.oid), "subtype")],
            pg_sys::TYPTYPE_MULTIRANGE => {
                vec![(pg_sys::get_multirange_range(facts.oid), "range type")]
            }
            _ => match pg_sys::get_element_type(facts.oid) {
                element if element == pg_sys::InvalidOid => Vec::new(),
                element => vec![(element, "element type")],
            },
        }
    }
}

/// The field types of a composite type's relation (dropped columns aside).
fn composite_fields(relation: pg_sys::Oid) -> Vec<pg_sys::Oid> {
    // SAFETY: the relcache entry of a composite type's relation, closed before returning.
    unsafe {
        let rel = pg_sys::RelationIdGetRelation(relation);
        if rel.is_null() {
            return vec![pg_sys::InvalidOid];
        }
        let desc = (*rel).rd_att;
        let fields = crate::compat::attributes(desc)
            .iter()
            .filter(|a| !a.attisdropped)
            .map(|a| a.atttypid)
            .collect();
        pg_sys::RelationClose(rel);
        fields
    }
}

/// Node kinds of an analyzed SELECT that carry a value (`exprType` knows them).
pub fn expression_kind(tag: pg_sys::NodeTag) -> bool {
    use pg_sys::NodeTag::*;
    matches!(
        tag,
        T_Var
            | T_Const
            | T_Param
            | T_Aggref
            | T_GroupingFunc
            | T_WindowFunc
            | T_SubscriptingRef
            | T_FuncExpr
            | T_NamedArgExpr
            | T_OpExpr
            | T_DistinctExpr
            | T_NullIfExpr
            | T_ScalarArrayOpExpr
            | T_BoolExpr
            | T_SubLink
            | T_FieldSelect
            | T_FieldStore
            | T_RelabelType
            | T_CoerceViaIO
            | T_ArrayCoerceExpr
            | T_ConvertRowtypeExpr
            | T_CollateExpr
            | T_CaseExpr
            | T_CaseTestExpr
            | T_ArrayExpr
            | T_RowExpr
            | T_RowCompareExpr
            | T_CoalesceExpr
            | T_MinMaxExpr
            | T_SQLValueFunction
            | T_XmlExpr
            | T_NullTest
            | T_BooleanTest
            | T_CoerceToDomain
            | T_CoerceToDomainValue
    ) || crate::compat::expression_kind(tag)
}

/// The transition, final, combine, (de)serialisation and moving-aggregate functions of an
/// aggregate, which run for it out of the tree's sight, its sort operator, and its state
/// types (an initial state is converted with its type's input function when it starts).
pub fn aggregate_support(
    aggregate: pg_sys::Oid,
) -> (Vec<pg_sys::Oid>, Option<pg_sys::Oid>, Vec<pg_sys::Oid>) {
    use crate::compat::numbers::*;
    // pg_aggregate's function columns, from aggtransfn to aggmfinalfn, and aggsortop.
    const SUPPORT_ATTRIBUTES: std::ops::RangeInclusive<i16> =
        ANUM_PG_AGGREGATE_AGGTRANSFN..=ANUM_PG_AGGREGATE_AGGMFINALFN;
    const SORT_OPERATOR: i16 = ANUM_PG_AGGREGATE_AGGSORTOP;
    let cache = pg_sys::SysCacheIdentifier::AGGFNOID as i32;
    // SAFETY: a syscache look-up, released before returning.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(cache, pg_sys::Datum::from(aggregate));
        if tuple.is_null() {
            return (Vec::new(), None, Vec::new());
        }
        let oid_at = |attribute: i16| {
            let mut is_null = true;
            let datum = pg_sys::SysCacheGetAttr(cache, tuple, attribute, &mut is_null);
            let oid = pg_sys::Oid::from(datum.value() as u32);
            (!is_null && oid != pg_sys::InvalidOid).then_some(oid)
        };
        let states = [
            ANUM_PG_AGGREGATE_AGGTRANSTYPE,
            ANUM_PG_AGGREGATE_AGGMTRANSTYPE,
        ]
        .into_iter()
        .filter_map(oid_at)
        .collect();
        let functions = SUPPORT_ATTRIBUTES.filter_map(oid_at).collect();
        let sort_operator = oid_at(SORT_OPERATOR);
        pg_sys::ReleaseSysCache(tuple);
        (functions, sort_operator, states)
    }
}

/// The function's default-argument expressions, when it has any.
pub fn default_arguments(function: pg_sys::Oid) -> Option<*mut pg_sys::Node> {
    // SAFETY: a syscache look-up, released before returning; the defaults are a node tree
    // PostgreSQL wrote.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::PROCOID as i32,
            pg_sys::Datum::from(function),
        );
        if tuple.is_null() {
            return None;
        }
        let mut is_null = true;
        let datum = pg_sys::SysCacheGetAttr(
            pg_sys::SysCacheIdentifier::PROCOID as i32,
            tuple,
            pg_sys::Anum_pg_proc_proargdefaults as pg_sys::AttrNumber,
            &mut is_null,
        );
        let defaults = if is_null {
            None
        } else {
            let text = pg_sys::text_to_cstring(datum.cast_mut_ptr());
            Some(pg_sys::stringToNode(text).cast::<pg_sys::Node>())
        };
        pg_sys::ReleaseSysCache(tuple);
        defaults
    }
}

/// The types of the function's result columns named by its OUT, INOUT or TABLE arguments: a
/// function returning `record` (`RETURNS TABLE (a int, s some_domain)`) converts its values to
/// them inside its call, a domain's CHECK included, and no node of a query shows them.
pub fn result_column_types(function: pg_sys::Oid) -> Vec<pg_sys::Oid> {
    /// Releases the syscache entry on every path.
    struct Entry(pg_sys::HeapTuple);
    impl Drop for Entry {
        fn drop(&mut self) {
            // SAFETY: the entry SearchSysCache1 returned below, released once.
            unsafe { pg_sys::ReleaseSysCache(self.0) }
        }
    }
    // SAFETY: a syscache look-up of a pg_proc row, read while it is held; the arrays
    // get_func_arg_info returns are palloc'd copies of its argument lists.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::PROCOID as i32,
            pg_sys::Datum::from(function),
        );
        if tuple.is_null() {
            return Vec::new();
        }
        let entry = Entry(tuple);
        let (mut types, mut names, mut modes) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        let count = pg_sys::get_func_arg_info(entry.0, &mut types, &mut names, &mut modes);
        if modes.is_null() || types.is_null() {
            return Vec::new();
        }
        let count = usize::try_from(count).unwrap_or(0);
        let (types, modes) = (
            std::slice::from_raw_parts(types, count),
            std::slice::from_raw_parts(modes, count),
        );
        types
            .iter()
            .zip(modes)
            .filter(|(_, &mode)| matches!(mode as u8, b'o' | b'b' | b't'))
            .map(|(&typ, _)| typ)
            .collect()
    }
}

/// Whether `call` is a cast (written `::` or `CAST`, or one the parser added).
///
/// # Safety
/// `call` is a function call node of an analysed tree.
pub unsafe fn is_cast(call: *const pg_sys::FuncExpr) -> bool {
    // SAFETY: the caller's contract.
    let form = unsafe { (*call).funcformat };
    matches!(
        form,
        pg_sys::CoercionForm::COERCE_EXPLICIT_CAST | pg_sys::CoercionForm::COERCE_IMPLICIT_CAST
    )
}

/// The base type of `typ` through its domains; `None` for a type that is gone (dropped since
/// it was read, where no lock holds it: PostgreSQL's own look-up would raise XX000).
pub fn base_type(mut typ: pg_sys::Oid) -> Option<pg_sys::Oid> {
    // Domains over domains: PostgreSQL allows no cycle, and the walk is bounded besides.
    for _ in 0..64 {
        let facts = TypeFacts::of(typ)?;
        if facts.kind != b'd' {
            return Some(typ);
        }
        typ = facts.base;
    }
    None
}

/// The CHECK expressions of `domain` as the catalog stores them (`pg_constraint.conbin`): read,
/// never planned. The type cache's copy is planned when it is loaded, and planning evaluates
/// immutable functions of constants, another role's included, before any walk could refuse
/// them.
///
/// # Safety
/// In a transaction.
pub unsafe fn stored_checks(domain: pg_sys::Oid) -> Vec<*mut pg_sys::Node> {
    use crate::compat::numbers::{
        ANUM_PG_CONSTRAINT_CONBIN, ANUM_PG_CONSTRAINT_CONTYPE, ANUM_PG_CONSTRAINT_CONTYPID,
        CONSTRAINT_RELATION_ID, CONSTRAINT_TYPID_INDEX_ID,
    };
    let check = |tuple: pg_sys::HeapTuple, desc: pg_sys::TupleDesc| {
        let mut is_null = true;
        // SAFETY: a tuple of pg_constraint, with its descriptor.
        let kind = unsafe {
            pg_sys::heap_getattr(tuple, ANUM_PG_CONSTRAINT_CONTYPE.into(), desc, &mut is_null)
        };
        !is_null && kind.value() as u8 == b'c'
    };
    // SAFETY: the caller's contract.
    unsafe {
        stored_trees(
            CONSTRAINT_RELATION_ID,
            CONSTRAINT_TYPID_INDEX_ID,
            ANUM_PG_CONSTRAINT_CONTYPID,
            domain,
            &[ANUM_PG_CONSTRAINT_CONBIN],
            &check,
            usize::MAX,
        )
    }
    .unwrap_or_default()
}

/// The expression trees of `columns` in the rows of `catalog` whose `key_column` is `key`
/// (found through `index`) that `wanted` takes, read from their stored text: never planned,
/// nor kept (a syscache look-up would keep each whole row, its text decompressed, for the
/// connection's life). `None` when one's text is longer than `max_bytes` (read from its size,
/// before it is decompressed).
///
/// # Safety
/// In a transaction; `key_column` and `columns` are attribute numbers of `catalog`, of types
/// oid and pg_node_tree.
pub unsafe fn stored_trees(
    catalog: u32,
    index: u32,
    key_column: i16,
    key: pg_sys::Oid,
    columns: &[i16],
    wanted: &dyn Fn(pg_sys::HeapTuple, pg_sys::TupleDesc) -> bool,
    max_bytes: usize,
) -> Option<Vec<*mut pg_sys::Node>> {
    let mut found = Vec::new();
    let mut too_long = false;
    // An ERROR between the scan's start and end releases both with the (sub)transaction.
    // SAFETY: an index scan of the catalog by its key, ended and closed before returning; each
    // expression is a node tree read from its text form into the current memory context.
    unsafe {
        let opened = pg_sys::table_open(
            pg_sys::Oid::from(catalog),
            pg_sys::AccessShareLock as pg_sys::LOCKMODE,
        );
        let mut scan_key: pg_sys::ScanKeyData = std::mem::zeroed();
        pg_sys::ScanKeyInit(
            &mut scan_key,
            key_column,
            pg_sys::BTEqualStrategyNumber as u16,
            pg_sys::regproc::from(pg_sys::F_OIDEQ),
            pg_sys::Datum::from(key),
        );
        let scan = pg_sys::systable_beginscan(
            opened,
            pg_sys::Oid::from(index),
            true,
            std::ptr::null_mut(),
            1,
            &mut scan_key,
        );
        let desc = (*opened).rd_att;
        'rows: loop {
            let tuple = pg_sys::systable_getnext(scan);
            if tuple.is_null() {
                break;
            }
            if !wanted(tuple, desc) {
                continue;
            }
            for &column in columns {
                let mut is_null = true;
                let text = pg_sys::heap_getattr(tuple, column.into(), desc, &mut is_null);
                if is_null {
                    continue;
                }
                if pg_sys::toast_raw_datum_size(text) > max_bytes {
                    too_long = true;
                    break 'rows;
                }
                let text = pg_sys::text_to_cstring(text.cast_mut_ptr());
                found.push(pg_sys::stringToNode(text).cast::<pg_sys::Node>());
            }
        }
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(opened, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
    }
    (!too_long).then_some(found)
}
