# Writes a C++ source defining pst::internal::kEmbeddedDefaultConfig from INPUT.
file(READ ${INPUT} content)
set(delim "PSTCFG")
file(WRITE ${OUTPUT} "// Generated from ${INPUT}; do not edit.\n#include <string_view>\nnamespace pst::internal {\nextern const std::string_view kEmbeddedDefaultConfig;\nconst std::string_view kEmbeddedDefaultConfig = R\"${delim}(${content})${delim}\";\n}  // namespace pst::internal\n")
