// llamacpp-json-schema.cpp — prints the GBNF grammar llama.cpp makes of a JSON schema (what
// `llama-cli --json-schema` / `-jf` constrain generation with): reads the schema from the file
// named on the command line (or stdin with "-"), parses it with common_json::parse and writes
// json_schema_to_grammar(schema, force_gbnf = true) to stdout.  Reference-data tool for
// scripts/make-grammar-refs.py (testdata/grammar/PROVENANCE.md); not part of llmi.  Build
// against a llama.cpp checkout L and its shared-library build B:
//   c++ -std=c++17 -O1 -o llamacpp-json-schema scripts/llamacpp-json-schema.cpp -IL/common \
//       -IL/include -IL/ggml/include -LB/bin -lllama-common -lllama -Wl,-rpath,B/bin
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>

#include "json-schema-to-grammar.h"

int main(int argc, char ** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s SCHEMA.json|-\n", argv[0]);
        return 2;
    }
    std::string text;
    if (std::string(argv[1]) == "-") {
        text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    } else {
        std::ifstream f(argv[1], std::ios::binary);
        if (!f) {
            std::fprintf(stderr, "cannot open %s\n", argv[1]);
            return 1;
        }
        text.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    try {
        std::string gbnf = json_schema_to_grammar(common_json::parse(text), true);
        std::fwrite(gbnf.data(), 1, gbnf.size(), stdout);
    } catch (const std::exception & e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
    return 0;
}
