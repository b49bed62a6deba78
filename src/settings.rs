//! Every `sql_query_engine.*` setting, registered once in `_PG_init`, read through the accessor
//! functions below (modelled on paradedb's `gucs.rs`). Plain data only: what a setting means is
//! decided where it is used (the guard parses `allowed_functions`, `llm` the endpoints).

use std::ffi::CStr;

use std::sync::atomic::{AtomicI32, Ordering};

use pgrx::{pg_sys, GucContext, GucFlags, GucRegistry, GucSetting, PostgresGucEnum};

/// When `sql_query_engine.vote` asks for candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PostgresGucEnum)]
pub enum VoteSetting {
    #[name = c"off"]
    Off,
    #[name = c"when_in_doubt"]
    WhenInDoubt,
    #[name = c"always"]
    Always,
}

/// Whether a doubtful answer is returned (`sql_query_engine.abstain`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PostgresGucEnum)]
pub enum AbstainSetting {
    #[name = c"off"]
    Off,
    #[name = c"when_in_doubt"]
    WhenInDoubt,
}

/// How the schema is written for the model (`sql_query_engine.schema_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PostgresGucEnum)]
pub enum SchemaFormat {
    #[name = c"ddl"]
    Ddl,
    #[name = c"mschema"]
    MSchema,
}

/// Which calls `sql_query_engine.audit_log` writes to the server log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PostgresGucEnum)]
pub enum AuditLog {
    #[name = c"off"]
    Off,
    #[name = c"errors"]
    Errors,
    #[name = c"all"]
    All,
}

/// Where prompts go: superuser-only, or a role could send the schema and the key elsewhere.
static LLM_URL: GucSetting<Option<std::ffi::CString>> =
    GucSetting::<Option<std::ffi::CString>>::new(None);
/// The model the endpoint is asked for: superuser-only, as it decides cost and where data goes.
static LLM_MODEL: GucSetting<Option<std::ffi::CString>> =
    GucSetting::<Option<std::ffi::CString>>::new(None);
/// The file the key is read from when a request is made: the key itself is never a setting.
static LLM_API_KEY_FILE: GucSetting<Option<std::ffi::CString>> =
    GucSetting::<Option<std::ffi::CString>>::new(None);
/// The retired key setting, kept only to refuse a value without echoing it.
static LLM_API_KEY_REFUSED: GucSetting<Option<std::ffi::CString>> =
    GucSetting::<Option<std::ffi::CString>>::new(None);
/// Functions (and with them types) beyond the built-ins that generated queries may use.
static ALLOWED_FUNCTIONS: GucSetting<Option<std::ffi::CString>> =
    GucSetting::<Option<std::ffi::CString>>::new(None);
/// Bounds what the model may write per answer (cost, and the work of extracting SQL).
static MAX_TOKENS: GucSetting<i32> = GucSetting::<i32>::new(1024);
/// Bounds what is read from an endpoint: a hostile one could send gigabytes.
static MAX_RESPONSE_BYTES: GucSetting<i32> = GucSetting::<i32>::new(1 << 20);
/// Which calls leave a server-log line, which no rollback or read-only transaction removes.
static AUDIT_LOG: GucSetting<AuditLog> = GucSetting::<AuditLog>::new(AuditLog::All);
/// Endpoints tried when `llm_url` fails, each with its own model and key file.
static LLM_FALLBACKS: GucSetting<Option<std::ffi::CString>> =
    GucSetting::<Option<std::ffi::CString>>::new(None);
/// How long a failed endpoint is skipped, so a dead provider does not cost every question its timeout.
static LLM_CIRCUIT_BREAKER_S: GucSetting<i32> = GucSetting::<i32>::new(30);
/// Whether the question's values are looked up in the columns that store them.
static VALUE_INDEX: GucSetting<bool> = GucSetting::<bool>::new(true);
/// When candidates are asked for and the result most agree on wins.
static VOTE: GucSetting<VoteSetting> = GucSetting::<VoteSetting>::new(VoteSetting::WhenInDoubt);
/// Refusing to guess: off returns the best answer whatever the doubts (the trace says them).
static ABSTAIN: GucSetting<AbstainSetting> = GucSetting::<AbstainSetting>::new(AbstainSetting::Off);
/// How much of a vote must give the answer's result for it to be sure, in percent: at least
/// half by default (the first query and one of four alternatives), so that one corroborating
/// alternative is enough and a lone query is not.
static ABSTAIN_AGREEMENT: GucSetting<i32> = GucSetting::<i32>::new(50);
/// How many candidates a vote asks for (a ceiling: each costs a model call).
static CANDIDATES: GucSetting<i32> = GucSetting::<i32>::new(4);
/// How the schema is written for the model.
static SCHEMA_FORMAT: GucSetting<SchemaFormat> = GucSetting::<SchemaFormat>::new(SchemaFormat::Ddl);
/// Bounds one model request, retries included (a ceiling: the backend waits this long).
static LLM_TIMEOUT_MS: GucSetting<i32> = GucSetting::<i32>::new(60_000);
/// Sampling temperature: 0 for repeatable SQL.
static TEMPERATURE: GucSetting<f64> = GucSetting::<f64>::new(0.0);
/// Bounds the repair loop (a ceiling: each repair is a model call and a query).
static MAX_REPAIRS: GucSetting<i32> = GucSetting::<i32>::new(4);
/// Bounds the time a call spends improving its answer (a ceiling: a vote and the repairs are
/// model calls that a slow model makes long).
static ANSWER_BUDGET_MS: GucSetting<i32> = GucSetting::<i32>::new(60_000);
/// Bounds each generated query (a ceiling).
static STATEMENT_TIMEOUT_MS: GucSetting<i32> = GucSetting::<i32>::new(10_000);
/// Bounds the rows kept per query (a ceiling).
static MAX_ROWS: GucSetting<i32> = GucSetting::<i32>::new(1000);
/// Whether generated queries may read the catalogs: off, questions about the schema are answered from the schema context.
static ALLOW_SYSTEM_CATALOGS: GucSetting<bool> = GucSetting::<bool>::new(false);
/// Narrows the schemas the model is told about.
static SCHEMAS: GucSetting<Option<std::ffi::CString>> =
    GucSetting::<Option<std::ffi::CString>>::new(None);
/// How many stored values per text column reach the model; 0 sends none (a ceiling).
static SAMPLE_VALUES: GucSetting<i32> = GucSetting::<i32>::new(3);
/// Tokens the schema may take before retrieval prunes it.
static PROMPT_BUDGET: GucSetting<i32> = GucSetting::<i32>::new(4000);
/// How many verified examples go into the prompt.
static EXAMPLES: GucSetting<i32> = GucSetting::<i32>::new(3);
/// Whether JSON output is asked for (dropped for endpoints that reject it).
static JSON_MODE: GucSetting<bool> = GucSetting::<bool>::new(true);
/// Where sessions and progress events are shared: superuser-only, as it decides where data goes.
static REDIS_URL: GucSetting<Option<std::ffi::CString>> =
    GucSetting::<Option<std::ffi::CString>>::new(None);
/// Bounds one Redis call before backend memory is used.
static REDIS_TIMEOUT_MS: GucSetting<i32> = GucSetting::<i32>::new(1000);
/// How many earlier turns of a session the model sees.
static SESSION_TURNS: GucSetting<i32> = GucSetting::<i32>::new(5);
/// How long a session lives after its last turn.
static SESSION_TTL_S: GucSetting<i32> = GucSetting::<i32>::new(3600);
/// Whether each step is reported as a NOTICE.
static PROGRESS: GucSetting<bool> = GucSetting::<bool>::new(false);
/// Whether calls are recorded in nl_history: superuser-only, the audited role cannot turn it off.
static HISTORY: GucSetting<bool> = GucSetting::<bool>::new(true);
/// Bounds the bytes of rows a query keeps (a ceiling): rows alone do not bound memory.
static MAX_RESULT_BYTES: GucSetting<i32> = GucSetting::<i32>::new(16 << 20);
/// Memory (MB) one attempt may add to the backend (a ceiling).
static MAX_QUERY_MEMORY_MB: GucSetting<i32> = GucSetting::<i32>::new(1024);
/// Temporary files (MB) an attempt may write (a ceiling, under the server's temp_file_limit).
static MAX_QUERY_TEMP_FILES_MB: GucSetting<i32> = GucSetting::<i32>::new(1024);
/// Roles whose code a superuser's call may run besides superusers' own.
static TRUSTED_OWNERS: GucSetting<Option<std::ffi::CString>> =
    GucSetting::<Option<std::ffi::CString>>::new(None);

pub fn init() {
    // Values set before the library loaded are checked while it defines its settings, as
    // whoever loads it: a role's, under a superuser's SECURITY DEFINER function.
    struct Loading;
    impl Drop for Loading {
        fn drop(&mut self) {
            LOADING.store(false, Ordering::Relaxed);
        }
    }
    LOADING.store(true, Ordering::Relaxed);
    let _loading = Loading;
    define();
}

/// Whether the library is defining its settings (`init`).
static LOADING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn define() {
    // SAFETY: the check hook only reads the proposed value and sets GUC's error fields.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"sql_query_engine.llm_url",
            c"Base URL of an OpenAI-compatible API, e.g. http://127.0.0.1:8080/v1 (superuser only, shown to superusers only).",
            c"Requests go to {llm_url}/chat/completions, with the key of llm_api_key_file.",
            &LLM_URL,
            GucContext::Suset,
            // Where requests and keys go, with any credentials written into a URL: for
            // superusers and pg_read_all_settings to read, like redis_url.
            GucFlags::SUPERUSER_ONLY | GucFlags::NO_SHOW_ALL,
            Some(refuse_stored_credentials),
            None,
            None,
        );
    }
    GucRegistry::define_string_guc(
        c"sql_query_engine.llm_model",
        c"Model name sent with every chat-completion request (superuser only).",
        c"",
        &LLM_MODEL,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"sql_query_engine.llm_api_key_file",
        c"File holding the API key for llm_url, sent as a Bearer token (superuser only).",
        c"Read by the server when a request is made; the key itself is never a setting, so no \
          SHOW, log line or catalog can reveal it.",
        &LLM_API_KEY_FILE,
        GucContext::Suset,
        // Where requests and keys go, with any credentials written into a URL: for
        // superusers and pg_read_all_settings to read, like redis_url.
        GucFlags::SUPERUSER_ONLY | GucFlags::NO_SHOW_ALL,
    );
    // The key used to be a setting; a value now is refused with a pointer to the file, and a
    // custom message, so that the refusal never echoes the value.
    // SAFETY: the check hook only reads the proposed value and sets GUC\'s error fields.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"sql_query_engine.llm_api_key",
            c"Not used: the API key is read from sql_query_engine.llm_api_key_file.",
            c"",
            &LLM_API_KEY_REFUSED,
            GucContext::Suset,
            GucFlags::SUPERUSER_ONLY | GucFlags::NO_SHOW_ALL,
            Some(refuse_api_key),
            None,
            None,
        );
    }
    // SAFETY: the check hook only reads the proposed value and sets GUC\'s error fields.
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            c"sql_query_engine.llm_timeout",
            c"How long one LLM request may take, retries included.",
            c"",
            &LLM_TIMEOUT_MS,
            100,
            i32::MAX,
            GucContext::Userset,
            GucFlags::UNIT_MS,
            Some(check_llm_timeout),
            None,
            None,
        );
    }
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
    // SAFETY: the check hook only reads the proposed value and sets GUC\'s error fields.
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            c"sql_query_engine.max_repairs",
            c"How many times a failed or empty query is sent back to the model for repair.",
            c"Repairs the model is asked for per question, after the first query.",
            &MAX_REPAIRS,
            0,
            20,
            GucContext::Userset,
            GucFlags::default(),
            Some(check_max_repairs),
            None,
            None,
        );
    }
    // SAFETY: the check hook only reads the proposed value and sets GUC\'s error fields.
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            c"sql_query_engine.answer_budget",
            c"How long a call may spend improving its answer (vote and repairs).",
            c"Counted from the start of the call. Once spent, no vote or repair is asked for, a \
              request in flight ends, and the best answer so far is returned; the first query \
              is always waited for (up to llm_timeout).",
            &ANSWER_BUDGET_MS,
            0,
            i32::MAX,
            GucContext::Userset,
            GucFlags::UNIT_MS,
            Some(check_answer_budget),
            None,
            None,
        );
    }
    // SAFETY: the check hook only reads the proposed value and sets GUC\'s error fields.
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            c"sql_query_engine.statement_timeout",
            c"Time limit for running one generated query.",
            c"",
            &STATEMENT_TIMEOUT_MS,
            1,
            i32::MAX,
            GucContext::Userset,
            GucFlags::UNIT_MS,
            Some(check_statement_timeout),
            None,
            None,
        );
    }
    // SAFETY: the check hook only reads the proposed value and sets GUC\'s error fields.
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            c"sql_query_engine.max_rows",
            c"Rows returned at most; further rows are cut and the trace says so.",
            c"",
            &MAX_ROWS,
            1,
            i32::MAX - 1,
            GucContext::Userset,
            GucFlags::default(),
            Some(check_max_rows),
            None,
            None,
        );
    }
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
        c"Unset: the search path's, then every other schema you may use that you, the database owner or a superuser own.",
        &SCHEMAS,
        GucContext::Userset,
        GucFlags::default(),
    );
    // SAFETY: the check hook only reads the proposed value and sets GUC\'s error fields.
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            c"sql_query_engine.sample_values",
            c"Sample values shown per text column; 0 sends no row data to the model at all.",
            c"Roles may lower it for themselves; only a superuser may raise it above the server's \
              setting.",
            &SAMPLE_VALUES,
            0,
            10,
            GucContext::Userset,
            GucFlags::default(),
            Some(check_sample_values),
            None,
            None,
        );
    }
    // SAFETY: the check hook only reads the proposed value and sets GUC's error fields.
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            c"sql_query_engine.prompt_budget",
            c"Estimated tokens the schema may take in the prompt; larger schemas are pruned to the relations relevant to the question.",
            c"",
            &PROMPT_BUDGET,
            100,
            i32::MAX,
            GucContext::Userset,
            GucFlags::default(),
            Some(check_prompt_budget),
            None,
            None,
        );
    }
    // SAFETY: the check hook only reads the proposed value and sets GUC's error fields.
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            c"sql_query_engine.examples",
            c"How many verified examples (nl_example_add) most similar to the question go into the prompt.",
            c"",
            &EXAMPLES,
            0,
            20,
            GucContext::Userset,
            GucFlags::default(),
            Some(check_examples),
            None,
            None,
        );
    }
    GucRegistry::define_bool_guc(
        c"sql_query_engine.json_mode",
        c"Ask the endpoint for a JSON answer (response_format json_object).",
        c"Endpoints that reject it are asked again without it, and not asked again in this session.",
        &JSON_MODE,
        GucContext::Userset,
        GucFlags::default(),
    );
    // SAFETY: the check hook only reads the proposed value and sets GUC's error fields.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"sql_query_engine.redis_url",
            c"Redis for shared conversations and progress events, e.g. redis://127.0.0.1:6379/0 (superuser only, never shown).",
            c"Unset: everything stays in backend memory.",
            &REDIS_URL,
            GucContext::Suset,
            GucFlags::SUPERUSER_ONLY | GucFlags::NO_SHOW_ALL,
            Some(refuse_stored_credentials),
            None,
            None,
        );
    }
    // SAFETY: the check hook only reads the proposed value and sets GUC's error fields.
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            c"sql_query_engine.redis_timeout",
            c"How long one Redis call may take before backend memory is used instead.",
            c"",
            &REDIS_TIMEOUT_MS,
            1,
            i32::MAX,
            GucContext::Userset,
            GucFlags::UNIT_MS,
            Some(check_redis_timeout),
            None,
            None,
        );
    }
    // SAFETY: the check hook only reads the proposed value and sets GUC's error fields.
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            c"sql_query_engine.session_turns",
            c"How many earlier turns of a session the model sees.",
            c"",
            &SESSION_TURNS,
            0,
            100,
            GucContext::Userset,
            GucFlags::default(),
            Some(check_session_turns),
            None,
            None,
        );
    }
    // SAFETY: the check hook only reads the proposed value and sets GUC's error fields.
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            c"sql_query_engine.session_ttl",
            c"How long a session's turns are kept in Redis after its last turn.",
            c"",
            &SESSION_TTL_S,
            1,
            i32::MAX,
            GucContext::Userset,
            GucFlags::UNIT_S,
            Some(check_session_ttl),
            None,
            None,
        );
    }
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
        c"Record every nl_query, nl_generate and nl_answer call in nl_history (superuser only).",
        c"Skipped silently in read-only transactions and on standbys. The role being audited \
          cannot switch it off.",
        &HISTORY,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_enum_guc(
        c"sql_query_engine.audit_log",
        c"Which calls are written to the server log (superuser only): off, errors or all.",
        c"A call that ends in an ERROR takes its nl_history row with it in the rollback; the \
          server log keeps role, function, question and outcome.",
        &AUDIT_LOG,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"sql_query_engine.allowed_functions",
        c"Functions generated queries may call beyond the built-ins (superuser only).",
        c"Comma-separated: extension:NAME and schema:NAME allow their non-VOLATILE functions, \
          SCHEMA.FUNCTION allows that function. Functions that run SQL given as text need their \
          qualified name.",
        &ALLOWED_FUNCTIONS,
        GucContext::Suset,
        GucFlags::default(),
    );
    // SAFETY: the check hook only reads the proposed value and sets GUC\'s error fields.
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            c"sql_query_engine.max_tokens",
            c"Longest answer the model may write, in tokens (sent as max_tokens).",
            c"",
            &MAX_TOKENS,
            16,
            65_536,
            GucContext::Userset,
            GucFlags::default(),
            Some(check_max_tokens),
            None,
            None,
        );
    }
    GucRegistry::define_int_guc(
        c"sql_query_engine.max_response_bytes",
        c"Largest model response read (superuser only); a larger one is an error.",
        c"",
        &MAX_RESPONSE_BYTES,
        1024,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_BYTE,
    );
    // SAFETY: the check hook only reads the proposed value and sets GUC's error fields.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"sql_query_engine.llm_fallbacks",
            c"Endpoints tried in order when llm_url fails (superuser only).",
            c"Comma-separated; each: URL [model=NAME] [key_file=PATH], its key only ever sent to it.",
            &LLM_FALLBACKS,
            GucContext::Suset,
            // Where requests and keys go, with any credentials written into a URL: for
            // superusers and pg_read_all_settings to read, like redis_url.
            GucFlags::SUPERUSER_ONLY | GucFlags::NO_SHOW_ALL,
            Some(refuse_stored_credentials),
            None,
            None,
        );
    }
    // SAFETY: the check hook only reads the proposed value and sets GUC's error fields.
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            c"sql_query_engine.llm_circuit_breaker",
            c"How long an endpoint that failed is skipped (in this backend) before it is tried again.",
            c"A role may only lower it: while an endpoint is skipped for a role, its questions go to the next one.",
            &LLM_CIRCUIT_BREAKER_S,
            0,
            86_400,
            GucContext::Userset,
            GucFlags::UNIT_S,
            Some(check_llm_circuit_breaker),
            None,
            None,
        );
    }
    GucRegistry::define_bool_guc(
        c"sql_query_engine.value_index",
        c"Look up the values the question names in the text columns that store them.",
        c"Only with sample_values > 0: the matches are stored values, shown to the model.",
        &VALUE_INDEX,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_enum_guc(
        c"sql_query_engine.vote",
        c"When to ask for several candidate queries and answer with the result most agree on.",
        c"off, when_in_doubt (the first query failed or returned no rows) or always.",
        &VOTE,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_enum_guc(
        c"sql_query_engine.abstain",
        c"Whether a doubtful answer is withheld: off, or when_in_doubt (raise 42P08 naming the interpretations).",
        c"Doubtful: fewer of a vote's alternatives than abstain_agreement gave the answer's result (or another result as many), the answer has no rows or only nulls, its query compares a column with a string the column does not store as written, or only a repair ran after every alternative failed.",
        &ABSTAIN,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"sql_query_engine.abstain_agreement",
        c"Percent of a vote's alternatives that must give the answer's result for it to be sure.",
        c"The first query counts to its result's group; another result with as many queries is a doubt whatever the share.",
        &ABSTAIN_AGREEMENT,
        1,
        100,
        GucContext::Userset,
        GucFlags::default(),
    );
    // SAFETY: the check hook only reads the proposed value and sets GUC\'s error fields.
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            c"sql_query_engine.candidates",
            c"Candidate queries asked for in a vote.",
            c"",
            &CANDIDATES,
            2,
            16,
            GucContext::Userset,
            GucFlags::default(),
            Some(check_candidates),
            None,
            None,
        );
    }
    GucRegistry::define_enum_guc(
        c"sql_query_engine.schema_format",
        c"How the schema is written for the model: ddl (CREATE TABLE statements) or mschema.",
        c"",
        &SCHEMA_FORMAT,
        GucContext::Userset,
        GucFlags::default(),
    );
    // SAFETY: the check hook only reads the proposed value and sets GUC\'s error fields.
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            c"sql_query_engine.max_result_bytes",
            c"Bytes of result rows kept at most per query; further rows are cut and the trace says so.",
            c"Bounds the backend's memory for results (rows are counted by their stored size and \
              by their JSON text). Roles may lower it for themselves; only a superuser may raise \
              it above the server's setting.",
            &MAX_RESULT_BYTES,
            1024,
            i32::MAX,
            GucContext::Userset,
            GucFlags::UNIT_BYTE,
            Some(check_max_result_bytes),
            None,
            None,
        );
    }
    // SAFETY: the check hook only reads the proposed value and sets GUC\'s error fields.
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            c"sql_query_engine.max_query_memory",
            c"Memory one query of the extension may add to the backend; past it the query is cancelled.",
            c"Checked ten times a second while the query runs (what the backend holds, as the \
              kernel counts it). Roles may lower it for themselves; only a superuser may raise it \
              above the server's setting.",
            &MAX_QUERY_MEMORY_MB,
            16,
            1 << 20,
            GucContext::Userset,
            GucFlags::UNIT_MB,
            Some(check_max_query_memory),
            None,
            None,
        );
        GucRegistry::define_int_guc_with_hooks(
            c"sql_query_engine.max_query_temp_files",
            c"Temporary files one query of the extension may write (its temp_file_limit).",
            c"Never above the server's temp_file_limit. Roles may lower it for themselves; only \
              a superuser may raise it above the server's setting.",
            &MAX_QUERY_TEMP_FILES_MB,
            0,
            1 << 20,
            GucContext::Userset,
            GucFlags::UNIT_MB,
            Some(check_max_query_temp_files),
            None,
            None,
        );
    }
    GucRegistry::define_string_guc(
        c"sql_query_engine.trusted_owners",
        c"Roles whose relations and functions a superuser's generated queries may use (superuser only).",
        c"Comma-separated role names. A call by a superuser (as current or session user) reads \
          only relations owned by superusers and these roles, and runs no function of another \
          owner: their code would run with a superuser's rights.",
        &TRUSTED_OWNERS,
        GucContext::Suset,
        GucFlags::default(),
    );
    // A mistyped sql_query_engine.* setting is an error instead of a silent placeholder.
    // SAFETY: reserves the prefix, once, in `_PG_init`.
    unsafe { pgrx::pg_sys::MarkGUCPrefixReserved(c"sql_query_engine".as_ptr()) };
}

fn string(setting: &GucSetting<Option<std::ffi::CString>>) -> Option<String> {
    setting
        .get()
        .map(|s| CStr::to_string_lossy(&s).trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Base URL of the model's OpenAI-compatible API, when set.
pub fn llm_url() -> Option<String> {
    string(&LLM_URL)
}

pub fn llm_model() -> Option<String> {
    string(&LLM_MODEL)
}

/// The file holding the key of `llm_url`, when set.
pub fn llm_api_key_file() -> Option<String> {
    string(&LLM_API_KEY_FILE)
}

/// The fallback endpoints as written (`URL [model=NAME] [key_file=PATH], ...`), when set.
pub fn llm_fallbacks() -> Option<String> {
    string(&LLM_FALLBACKS)
}

/// Refuses to store a URL with credentials (user information, a query or a fragment) with
/// `ALTER DATABASE` or `ALTER ROLE ... SET` (validated with the source `PGC_S_TEST`): stored
/// there it is in `pg_db_role_setting`, which every role may read, although `SHOW` is the
/// superuser's. A value already stored, `SET`, the configuration file and `ALTER SYSTEM` are
/// not refused. The value is never echoed.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn refuse_stored_credentials(
    newval: *mut *mut std::ffi::c_char,
    _extra: *mut *mut std::ffi::c_void,
    source: pg_sys::GucSource::Type,
) -> bool {
    if source != pg_sys::GucSource::PGC_S_TEST {
        return true;
    }
    // SAFETY: GUC passes a pointer to the proposed value (a string or NULL).
    let value = unsafe {
        if newval.is_null() || (*newval).is_null() {
            return true;
        }
        CStr::from_ptr(*newval).to_string_lossy()
    };
    // Judged by the bytes, not by a parse: the clients that read it parse otherwise (the URL
    // parser drops tabs and line breaks, `unix:/path?pass=` has no `://`), and no endpoint
    // needs these characters outside user information, a query or a fragment.
    let with_credentials = value
        .chars()
        .any(|c| matches!(c, '@' | '?' | '#') || c.is_control());
    if !with_credentials {
        return true;
    }
    // SAFETY: GUC's check-hook error fields, given static messages.
    unsafe {
        pg_sys::GUC_check_errcode(pgrx::PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE as i32);
        pg_sys::GUC_check_errmsg_string = c"a URL with credentials (a password, a query or a \
            fragment) is not stored with ALTER DATABASE or ALTER ROLE: every role may read \
            pg_db_role_setting"
            .as_ptr()
            .cast_mut();
        pg_sys::GUC_check_errhint_string = c"Set it in postgresql.conf or with ALTER SYSTEM, and \
            keep keys in the file sql_query_engine.llm_api_key_file names."
            .as_ptr()
            .cast_mut();
    }
    false
}

/// Refuses any value for the retired `llm_api_key` setting, without echoing it.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn refuse_api_key(
    newval: *mut *mut std::ffi::c_char,
    _extra: *mut *mut std::ffi::c_void,
    _source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: GUC passes a pointer to the proposed value (a string or NULL).
    let empty = unsafe { newval.is_null() || (*newval).is_null() || *(*newval) == 0 };
    if empty {
        return true;
    }
    // SAFETY: GUC's check-hook error fields, given static messages.
    unsafe {
        pg_sys::GUC_check_errcode(pgrx::PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE as i32);
        pg_sys::GUC_check_errmsg_string = c"sql_query_engine.llm_api_key is not used: keys are \
            never stored in settings, but read from the file sql_query_engine.llm_api_key_file names"
            .as_ptr()
            .cast_mut();
        pg_sys::GUC_check_errhint_string = c"Write the key to a file the server can read and set \
            sql_query_engine.llm_api_key_file to its path."
            .as_ptr()
            .cast_mut();
    }
    false
}

/// A bound that the server's configuration sets and roles may only lower for themselves:
/// a value from the defaults, the configuration file, the command line or `ALTER ROLE ALL`
/// becomes the ceiling; a role's `SET` or `ALTER ROLE` above it is refused unless a superuser
/// makes it. A value stored with `ALTER DATABASE` or `ALTER ROLE` that a role logs in with (or
/// loads the library with) applies up to the ceiling for a role that is not a superuser: it may
/// have been stored while the library was not loaded, unchecked, and refusing it would warn in
/// every connection of the role, whether it uses the extension or not. A value set before the
/// library loaded applies up to the ceiling too, in a session of a role that is not a
/// superuser, whoever loads it: a superuser's SECURITY DEFINER function may be what loads it.
///
/// The ceiling is also applied where the value is read (`bound`), unless the call is a
/// superuser's: a session's values are checked as they arrive, before the ceiling is complete
/// (connection options and `ALTER ROLE` values come before `ALTER ROLE ALL`'s), a reload may
/// lower it after a role's `SET`, and a superuser's value stays set after `SET ROLE`.
struct Ceiling {
    /// The defaults', the file's or the command line's value (a reload checks the file again).
    server: AtomicI32,
    /// `ALTER ROLE ALL`'s value, which replaces the server's (`NONE` when there is none): a
    /// reload re-reads the file, not it.
    global: AtomicI32,
    refusal: &'static CStr,
}

/// No value (the settings with ceilings take no negative values).
const NONE: i32 = i32::MIN;

impl Ceiling {
    const fn new(refusal: &'static CStr) -> Ceiling {
        Ceiling {
            server: AtomicI32::new(i32::MAX),
            global: AtomicI32::new(NONE),
            refusal,
        }
    }

    fn ceiling(&self) -> i32 {
        match self.global.load(Ordering::Relaxed) {
            NONE => self.server.load(Ordering::Relaxed),
            global => global,
        }
    }

    /// `value` as it applies: at most the ceiling, unless the call is a superuser's.
    fn bound(&self, value: i32) -> i32 {
        // SAFETY: reads whether the current user is a superuser (cached by PostgreSQL).
        if unsafe { pg_sys::superuser() } {
            return value;
        }
        value.min(self.ceiling())
    }

    /// The check hook's verdict on `value` from `source` (lowered to the ceiling for a stored
    /// setting).
    fn check(&self, value: &mut i32, source: pg_sys::GucSource::Type) -> bool {
        use pg_sys::GucSource::{PGC_S_DATABASE, PGC_S_DATABASE_USER, PGC_S_GLOBAL, PGC_S_USER};
        // A parallel worker takes its leader's values as they are: it first resets each to
        // the built-in default (which would become its server's value here) and never reads
        // the file's, so a value the leader was allowed would be refused, and with it every
        // parallel query of a session that lowered a setting from the file's value.
        // SAFETY: reads a flag PostgreSQL sets while a parallel worker starts.
        if unsafe { pg_sys::InitializingParallelWorker } {
            return true;
        }
        if source < PGC_S_GLOBAL {
            self.server.store(*value, Ordering::Relaxed);
            return true;
        }
        if source == PGC_S_GLOBAL {
            self.global.store(*value, Ordering::Relaxed);
            return true;
        }
        let ceiling = self.ceiling();
        // While the library loads, the current user is whoever loads it (a superuser's
        // SECURITY DEFINER function, in a role's session): the session's user must be one
        // too, and the current one (a superuser's session after SET ROLE).
        let loading = LOADING.load(Ordering::Relaxed);
        // SAFETY: a check hook runs in a backend, where the current and session users are
        // known.
        let superuser = unsafe {
            pg_sys::superuser() && (!loading || pg_sys::superuser_arg(pg_sys::GetSessionUserId()))
        };
        if *value <= ceiling || superuser {
            return true;
        }
        if loading || matches!(source, PGC_S_DATABASE | PGC_S_USER | PGC_S_DATABASE_USER) {
            *value = ceiling;
            return true;
        }
        // SAFETY: GUC's check-hook error fields, given a static message.
        unsafe {
            pg_sys::GUC_check_errcode(pgrx::PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE as i32);
            pg_sys::GUC_check_errmsg_string = self.refusal.as_ptr().cast_mut();
        }
        false
    }
}

/// A check hook for an integer setting with a `Ceiling`.
macro_rules! ceiling_hook {
    ($hook:ident, $ceiling:ident, $name:literal) => {
        static $ceiling: Ceiling = Ceiling::new(
            match CStr::from_bytes_with_nul(
                concat!(
                    "only a superuser may raise sql_query_engine.",
                    $name,
                    " above the server's setting\0"
                )
                .as_bytes(),
            ) {
                Ok(message) => message,
                Err(_) => c"only a superuser may raise this setting above the server's setting",
            },
        );

        #[pgrx::pg_guard]
        unsafe extern "C-unwind" fn $hook(
            newval: *mut std::ffi::c_int,
            _extra: *mut *mut std::ffi::c_void,
            source: pg_sys::GucSource::Type,
        ) -> bool {
            // SAFETY: GUC passes a valid pointer to the proposed value, which a check hook may
            // change.
            $ceiling.check(unsafe { &mut *newval }, source)
        }
    };
}

ceiling_hook!(check_sample_values, SAMPLE_VALUES_CEILING, "sample_values");
ceiling_hook!(check_max_rows, MAX_ROWS_CEILING, "max_rows");
ceiling_hook!(
    check_max_result_bytes,
    MAX_RESULT_BYTES_CEILING,
    "max_result_bytes"
);
ceiling_hook!(
    check_statement_timeout,
    STATEMENT_TIMEOUT_CEILING,
    "statement_timeout"
);
ceiling_hook!(check_llm_timeout, LLM_TIMEOUT_CEILING, "llm_timeout");
// Where a role's questions go: an endpoint skipped for a role sends them to the next one.
ceiling_hook!(
    check_llm_circuit_breaker,
    LLM_CIRCUIT_BREAKER_CEILING,
    "llm_circuit_breaker"
);
ceiling_hook!(
    check_max_query_memory,
    MAX_QUERY_MEMORY_CEILING,
    "max_query_memory"
);
ceiling_hook!(
    check_max_query_temp_files,
    MAX_QUERY_TEMP_FILES_CEILING,
    "max_query_temp_files"
);
ceiling_hook!(check_max_repairs, MAX_REPAIRS_CEILING, "max_repairs");
ceiling_hook!(check_answer_budget, ANSWER_BUDGET_CEILING, "answer_budget");
ceiling_hook!(check_candidates, CANDIDATES_CEILING, "candidates");
ceiling_hook!(check_max_tokens, MAX_TOKENS_CEILING, "max_tokens");
// What a role's call costs others: the model's tokens, the time a Redis call may hold, and how
// long its keys stay in the Redis every role shares.
ceiling_hook!(check_prompt_budget, PROMPT_BUDGET_CEILING, "prompt_budget");
ceiling_hook!(check_redis_timeout, REDIS_TIMEOUT_CEILING, "redis_timeout");
ceiling_hook!(check_session_ttl, SESSION_TTL_CEILING, "session_ttl");
// How much of the prompt a role's call fills with what it chooses: examples and earlier turns.
ceiling_hook!(check_examples, EXAMPLES_CEILING, "examples");
ceiling_hook!(check_session_turns, SESSION_TURNS_CEILING, "session_turns");

/// Functions beyond the built-ins that generated queries may call, as written (the guard
/// parses it).
pub fn allowed_functions() -> String {
    string(&ALLOWED_FUNCTIONS).unwrap_or_default()
}

pub fn max_tokens() -> u32 {
    MAX_TOKENS_CEILING.bound(MAX_TOKENS.get()).max(16) as u32
}

pub fn max_response_bytes() -> u64 {
    MAX_RESPONSE_BYTES.get().max(1024) as u64
}

pub fn audit_log() -> AuditLog {
    AUDIT_LOG.get()
}

pub fn llm_circuit_breaker() -> std::time::Duration {
    std::time::Duration::from_secs(
        LLM_CIRCUIT_BREAKER_CEILING
            .bound(LLM_CIRCUIT_BREAKER_S.get())
            .max(0) as u64,
    )
}

/// Whether the value index is used (never with sample values off).
pub fn value_index() -> bool {
    VALUE_INDEX.get() && sample_values() > 0
}

pub fn vote() -> VoteSetting {
    VOTE.get()
}

pub fn abstain() -> AbstainSetting {
    ABSTAIN.get()
}

pub fn abstain_agreement() -> u8 {
    ABSTAIN_AGREEMENT.get().clamp(1, 100) as u8
}

pub fn candidates() -> usize {
    CANDIDATES_CEILING.bound(CANDIDATES.get()).clamp(2, 16) as usize
}

pub fn schema_format() -> SchemaFormat {
    SCHEMA_FORMAT.get()
}

pub fn llm_timeout_ms() -> u64 {
    LLM_TIMEOUT_CEILING.bound(LLM_TIMEOUT_MS.get()).max(1) as u64
}

/// Whether the call's `llm_timeout` is below the server's: the role lowered it for itself.
pub fn llm_timeout_lowered() -> bool {
    LLM_TIMEOUT_CEILING.bound(LLM_TIMEOUT_MS.get()) < LLM_TIMEOUT_CEILING.ceiling()
}

pub fn temperature() -> f64 {
    TEMPERATURE.get()
}

pub fn max_repairs() -> usize {
    MAX_REPAIRS_CEILING.bound(MAX_REPAIRS.get()).max(0) as usize
}

/// How long a call may spend on its answer before it stops asking the model for better.
pub fn answer_budget() -> std::time::Duration {
    std::time::Duration::from_millis(
        ANSWER_BUDGET_CEILING.bound(ANSWER_BUDGET_MS.get()).max(0) as u64
    )
}

/// Bytes one query may add to the backend's memory (`max_query_memory`).
pub fn max_query_memory_bytes() -> u64 {
    (MAX_QUERY_MEMORY_CEILING
        .bound(MAX_QUERY_MEMORY_MB.get())
        .max(16) as u64)
        << 20
}

/// Kilobytes of temporary files one query may write (`max_query_temp_files`), as
/// `temp_file_limit` takes them.
pub fn max_query_temp_files_kb() -> i64 {
    i64::from(
        MAX_QUERY_TEMP_FILES_CEILING
            .bound(MAX_QUERY_TEMP_FILES_MB.get())
            .max(0),
    ) << 10
}

pub fn statement_timeout_ms() -> i32 {
    STATEMENT_TIMEOUT_CEILING
        .bound(STATEMENT_TIMEOUT_MS.get())
        .max(1)
}

pub fn max_rows() -> usize {
    MAX_ROWS_CEILING.bound(MAX_ROWS.get()).max(1) as usize
}

pub fn max_result_bytes() -> usize {
    MAX_RESULT_BYTES_CEILING
        .bound(MAX_RESULT_BYTES.get())
        .max(1024) as usize
}

/// The roles a superuser's call trusts besides superusers (`trusted_owners`).
pub fn trusted_owners() -> Vec<String> {
    string(&TRUSTED_OWNERS)
        .map(|s| {
            s.split(',')
                .map(|part| part.trim().trim_matches('"').to_string())
                .filter(|part| !part.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// The schemas to read, when set (otherwise the search path's).
/// The most schemas `schemas` names that count (each is looked up at every question).
const MAX_SCHEMAS: usize = 1000;

pub fn schemas() -> Option<Vec<String>> {
    string(&SCHEMAS).map(|s| {
        s.split(',')
            .map(|part| part.trim().trim_matches('"').to_string())
            .filter(|part| !part.is_empty())
            .take(MAX_SCHEMAS)
            .collect()
    })
}

pub fn sample_values() -> usize {
    SAMPLE_VALUES_CEILING.bound(SAMPLE_VALUES.get()).max(0) as usize
}

pub fn prompt_budget() -> usize {
    PROMPT_BUDGET_CEILING.bound(PROMPT_BUDGET.get()).max(1) as usize
}

pub fn examples() -> usize {
    EXAMPLES_CEILING.bound(EXAMPLES.get()).max(0) as usize
}

/// The Redis URL, when Redis is to be used.
pub fn redis_url() -> Option<String> {
    string(&REDIS_URL)
}

pub fn redis_timeout_ms() -> u64 {
    REDIS_TIMEOUT_CEILING.bound(REDIS_TIMEOUT_MS.get()).max(1) as u64
}

pub fn session_turns() -> usize {
    SESSION_TURNS_CEILING.bound(SESSION_TURNS.get()).max(0) as usize
}

pub fn session_ttl_s() -> u64 {
    SESSION_TTL_CEILING.bound(SESSION_TTL_S.get()).max(1) as u64
}

pub fn progress() -> bool {
    PROGRESS.get()
}

pub fn history() -> bool {
    HISTORY.get()
}

pub fn json_mode() -> bool {
    JSON_MODE.get()
}

pub fn allow_system_catalogs() -> bool {
    ALLOW_SYSTEM_CATALOGS.get()
}
