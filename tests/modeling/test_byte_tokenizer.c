// The C byte tokenizer against ids the Python twin (tools/byte_tokenizer.py) wrote
// (tests/fixtures/tokenizer/byte_cases.json): encode gives the same ids, decode gives the text back.
#include <criterion/criterion.h>
#include <jansson.h>
#include <string.h>

#include "modeling/target/byte_tokenizer.h"

Test(byte_tokenizer, matches_the_python_tokenizer) {
  json_error_t je;
  json_t *doc = json_load_file(DF_FIXTURE_DIR "/tokenizer/byte_cases.json", 0, &je);
  cr_assert(doc, "%s", je.text);
  json_t *cases = json_object_get(doc, "cases"), *c;
  size_t i;
  cr_assert_geq(json_array_size(cases), 5);
  json_array_foreach(cases, i, c) {
    const char *text = json_string_value(json_object_get(c, "text"));
    json_t *want = json_object_get(c, "ids");
    int32_t ids[256];
    size_t n = df_byte_tok_encode(text, strlen(text), ids);
    cr_assert_eq(n, json_array_size(want), "case %zu: %zu ids, want %zu", i, n, json_array_size(want));
    for (size_t k = 0; k < n; k++)
      cr_assert_eq(ids[k], json_integer_value(json_array_get(want, k)), "case %zu id %zu", i, k);
    char back[512];
    cr_assert_eq(df_byte_tok_decode(ids, n, back, sizeof back), strlen(text));
    cr_assert_str_eq(back, text);
  }
  json_decref(doc);
}

Test(byte_tokenizer, specials_and_truncated_decode) {
  cr_assert_str_eq(df_byte_tok_special(DF_BYTE_TOK_MASK), "<|mask|>");
  cr_assert_null(df_byte_tok_special(260));
  const int32_t ids[] = {104, 105, DF_BYTE_TOK_IM_END, 261};
  char buf[6];
  cr_assert_eq(df_byte_tok_decode(ids, 4, buf, sizeof buf), 2 + strlen("<|im_end|>"));
  cr_assert_str_eq(buf, "hi<|i");
}
