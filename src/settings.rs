//! Every `sql_query_engine.*` setting, registered once in `_PG_init`, read through the accessor
//! functions below (modelled on paradedb's `gucs.rs`).

use std::ffi::CStr;

use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

use crate::error::{Error, Result};

static LLM_URL: GucSetting<Option<std::ffi::CString>> =
    GucSetting::<Option<std::ffi::CString>>::new(None);
static LLM_MODEL: GucSetting<Option<std::ffi::CString>> =
    GucSetting::<Option<std::ffi::CString>>::new(None);
static LLM_API_KEY: GucSetting<Option<std::ffi::CString>> =
    GucSetting::<Option<std::ffi::CString>>::new(None);
static LLM_TIMEOUT_MS: GucSetting<i32> = GucSetting::<i32>::new(60_000);
static TEMPERATURE: GucSetting<f64> = GucSetting::<f64>::new(0.0);
static MAX_REPAIRS: GucSetting<i32> = GucSetting::<i32>::new(4);
static STATEMENT_TIMEOUT_MS: GucSetting<i32> = GucSetting::<i32>::new(10_000);
static MAX_ROWS: GucSetting<i32> = GucSetting::<i32>::new(1000);
static ALLOW_SYSTEM_CATALOGS: GucSetting<bool> = GucSetting::<bool>::new(false);
static SCHEMAS: GucSetting<Option<std::ffi::CString>> =
    GucSetting::<Option<std::ffi::CString>>::new(None);
static SAMPLE_VALUES: GucSetting<i32> = GucSetting::<i32>::new(3);
static PROMPT_BUDGET: GucSetting<i32> = GucSetting::<i32>::new(4000);
static EXAMPLES: GucSetting<i32> = GucSetting::<i32>::new(3);
static JSON_MODE: GucSetting<bool> = GucSetting::<bool>::new(true);
static REDIS_URL: GucSetting<Option<std::ffi::CString>> =
    GucSetting::<Option<std::ffi::CString>>::new(None);
static REDIS_TIMEOUT_MS: GucSetting<i32> = GucSetting::<i32>::new(1000);
static SESSION_TURNS: GucSetting<i32> = GucSetting::<i32>::new(5);
static SESSION_TTL_S: GucSetting<i32> = GucSetting::<i32>::new(3600);
static PROGRESS: GucSetting<bool> = GucSetting::<bool>::new(false);
static HISTORY: GucSetting<bool> = GucSetting::<bool>::new(true);

pub fn init() {
    GucRegistry::define_string_guc(
        c"sql_query_engine.llm_url",
        c"Base URL of an OpenAI-compatible API, e.g. http://127.0.0.1:8080/v1.",
        c"Requests go to {llm_url}/chat/completions.",
        &LLM_URL,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"sql_query_engine.llm_model",
        c"Model name sent with every chat-completion request.",
        c"",
        &LLM_MODEL,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"sql_query_engine.llm_api_key",
        c"API key sent as a Bearer token (superuser only, never shown).",
        c"",
        &LLM_API_KEY,
        GucContext::Suset,
        GucFlags::SUPERUSER_ONLY | GucFlags::NO_SHOW_ALL,
    );
    GucRegistry::define_int_guc(
        c"sql_query_engine.llm_timeout",
        c"How long one LLM request may take, retries included.",
        c"",
        &LLM_TIMEOUT_MS,
        100,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_float_guc(
        c"sql_query_engine.temperature",
        c"Sampling temperature sent to the model.",
        c"",
        &TEMPERATURE,
        0.0,
        2.0,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"sql_query_engine.max_repairs",
        c"How many times a failed or empty query is sent back to the model for repair.",
        c"At most 1 + max_repairs queries run per question.",
        &MAX_REPAIRS,
        0,
        20,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"sql_query_engine.statement_timeout",
        c"Time limit for running one generated query.",
        c"",
        &STATEMENT_TIMEOUT_MS,
        1,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"sql_query_engine.max_rows",
        c"Rows returned at most; further rows are cut and the trace says so.",
        c"",
        &MAX_ROWS,
        1,
        i32::MAX - 1,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"sql_query_engine.allow_system_catalogs",
        c"Whether generated queries may read pg_catalog and information_schema.",
        c"Off by default: questions about the schema are answered from the schema context.",
        &ALLOW_SYSTEM_CATALOGS,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"sql_query_engine.schemas",
        c"Schemas whose relations the model is told about (comma-separated).",
        c"Unset: the schemas of the search path.",
        &SCHEMAS,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"sql_query_engine.sample_values",
        c"Sample values shown per text column; 0 sends no row data to the model at all.",
        c"",
        &SAMPLE_VALUES,
        0,
        10,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"sql_query_engine.prompt_budget",
        c"Estimated tokens the schema may take in the prompt; larger schemas are pruned to the relations relevant to the question.",
        c"",
        &PROMPT_BUDGET,
        100,
        i32::MAX,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"sql_query_engine.examples",
        c"How many verified examples (nl_example_add) most similar to the question go into the prompt.",
        c"",
        &EXAMPLES,
        0,
        20,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"sql_query_engine.json_mode",
        c"Ask the endpoint for a JSON answer (response_format json_object).",
        c"Endpoints that reject it are asked again without it, and not asked again in this session.",
        &JSON_MODE,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"sql_query_engine.redis_url",
        c"Redis for shared conversations, progress events and the schema cache, e.g. redis://127.0.0.1:6379/0 (superuser only, never shown).",
        c"Unset: everything stays in backend memory.",
        &REDIS_URL,
        GucContext::Suset,
        GucFlags::SUPERUSER_ONLY | GucFlags::NO_SHOW_ALL,
    );
    GucRegistry::define_int_guc(
        c"sql_query_engine.redis_timeout",
        c"How long one Redis call may take before backend memory is used instead.",
        c"",
        &REDIS_TIMEOUT_MS,
        1,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"sql_query_engine.session_turns",
        c"How many earlier turns of a session the model sees.",
        c"",
        &SESSION_TURNS,
        0,
        100,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"sql_query_engine.session_ttl",
        c"How long a session's turns are kept in Redis after its last turn.",
        c"",
        &SESSION_TTL_S,
        1,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_bool_guc(
        c"sql_query_engine.progress",
        c"Report each step of a question as a NOTICE while it happens.",
        c"(Not named verbose: VERBOSE is an SQL keyword, and SET would need it quoted.)",
        &PROGRESS,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"sql_query_engine.history",
        c"Record every nl_query, nl_generate and nl_answer call in nl_history.",
        c"Skipped silently in read-only transactions and on standbys.",
        &HISTORY,
        GucContext::Userset,
        GucFlags::default(),
    );
    // A mistyped sql_query_engine.* setting is an error instead of a silent placeholder.
    unsafe { pgrx::pg_sys::MarkGUCPrefixReserved(c"sql_query_engine".as_ptr()) };
}

fn string(setting: &GucSetting<Option<std::ffi::CString>>) -> Option<String> {
    setting
        .get()
        .map(|s| CStr::to_string_lossy(&s).trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Base URL of the LLM endpoint, required.
pub fn llm_url() -> Result<String> {
    string(&LLM_URL).ok_or_else(|| Error::Setting {
        message: "sql_query_engine.llm_url is not set".into(),
        hint: "Point it at an OpenAI-compatible API, e.g. \
               SET sql_query_engine.llm_url = 'http://127.0.0.1:8080/v1'."
            .into(),
    })
}

pub fn llm_model() -> Option<String> {
    string(&LLM_MODEL)
}

/// The API key. Only ever used for the Authorization header.
pub fn llm_api_key() -> Option<String> {
    string(&LLM_API_KEY)
}

pub fn llm_timeout_ms() -> u64 {
    LLM_TIMEOUT_MS.get().max(1) as u64
}

pub fn temperature() -> f64 {
    TEMPERATURE.get()
}

pub fn max_repairs() -> usize {
    MAX_REPAIRS.get().max(0) as usize
}

pub fn statement_timeout_ms() -> i32 {
    STATEMENT_TIMEOUT_MS.get().max(1)
}

pub fn max_rows() -> usize {
    MAX_ROWS.get().max(1) as usize
}

/// The schemas to read, when set (otherwise the search path's).
pub fn schemas() -> Option<Vec<String>> {
    string(&SCHEMAS).map(|s| {
        s.split(',')
            .map(|part| part.trim().trim_matches('"').to_string())
            .filter(|part| !part.is_empty())
            .collect()
    })
}

pub fn sample_values() -> usize {
    SAMPLE_VALUES.get().max(0) as usize
}

pub fn prompt_budget() -> usize {
    PROMPT_BUDGET.get().max(1) as usize
}

pub fn examples() -> usize {
    EXAMPLES.get().max(0) as usize
}

/// The Redis URL, when Redis is to be used.
pub fn redis_url() -> Option<String> {
    string(&REDIS_URL)
}

pub fn redis_timeout_ms() -> u64 {
    REDIS_TIMEOUT_MS.get().max(1) as u64
}

pub fn session_turns() -> usize {
    SESSION_TURNS.get().max(0) as usize
}

pub fn session_ttl_s() -> u64 {
    SESSION_TTL_S.get().max(1) as u64
}

pub fn progress() -> bool {
    PROGRESS.get()
}

pub fn history() -> bool {
    HISTORY.get()
}

/// A URL as it may be shown: without the credentials it may carry.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}{}", &url[..scheme_end + 3], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}

/// `text` with the secrets of `url` (the whole URL, its credentials) replaced.
pub fn redact(text: &str, url: &str) -> String {
    let mut text = text.replace(url, &redact_url(url));
    if let (Some(scheme_end), Some(at)) = (url.find("://"), url.rfind('@')) {
        if at > scheme_end + 3 {
            let credentials = &url[scheme_end + 3..at];
            text = text.replace(credentials, "[credentials]");
        }
    }
    text
}

pub fn json_mode() -> bool {
    JSON_MODE.get()
}

pub fn allow_system_catalogs() -> bool {
    ALLOW_SYSTEM_CATALOGS.get()
}
