//! The tags of the two XML tool-call dialects the body scanner reads: ATEM
//! ([`super::atem`]) and Qwen3-Coder XML ([`super::qwen3_xml`]). Data only, so
//! the dialects' parsers and the shared body scanner can both depend on it.

use super::xml_calls::XmlDialect;

/// ATEM XML (spec §3–§4).
pub(crate) static ATEM: XmlDialect = XmlDialect {
    block_open: "<atem:function_calls>",
    block_close: "</atem:function_calls>",
    invoke_prefix: "<atem:invoke",
    invoke_close: "</atem:invoke>",
    param_prefix: "<atem:parameter",
    param_close: "</atem:parameter>",
    name_attr: true,
    qwen_values: false,
};

/// Qwen3-Coder XML (spec §8.2).
pub(crate) static QWEN3_XML: XmlDialect = XmlDialect {
    block_open: "<tool_call>",
    block_close: "</tool_call>",
    invoke_prefix: "<function=",
    invoke_close: "</function>",
    param_prefix: "<parameter=",
    param_close: "</parameter>",
    name_attr: false,
    qwen_values: true,
};
