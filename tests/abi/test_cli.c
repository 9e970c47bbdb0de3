/* framework/base/args.c: edit distances worked out by hand, the "did you mean" rule, and the option
 * parser's forms (--name VALUE, --name=VALUE, repeatable options in order, errors). */
#include <stdlib.h>
#include <string.h>

#include "base/args.h"
#include "ztest.h"

static void test_edit_distance(void)
{
    ZT_CHECK_INT(zt_edit_distance("", ""), 0);
    ZT_CHECK_INT(zt_edit_distance("", "abc"), 3);        /* three insertions */
    ZT_CHECK_INT(zt_edit_distance("abc", ""), 3);        /* three deletions */
    ZT_CHECK_INT(zt_edit_distance("kitten", "sitting"), 3); /* k->s, e->i, +g */
    ZT_CHECK_INT(zt_edit_distance("flaw", "lawn"), 2);   /* -f, +n */
    ZT_CHECK_INT(zt_edit_distance("adamw", "adamw"), 0);
    ZT_CHECK_INT(zt_edit_distance("--lst-plugins", "--list-plugins"), 1);
}

static void test_near_words(void)
{
    /* Up to 2 edits always; a third of the length for longer words. */
    ZT_CHECK(zt_is_near_word("sgdd", "sgd"));
    ZT_CHECK(zt_is_near_word("ab", "xy"));            /* 2 edits on a 2-letter word: still allowed */
    ZT_CHECK(!zt_is_near_word("abc", "xyz"));          /* 3 edits > max(2, 1) */
    ZT_CHECK(zt_is_near_word("optimizer.params.momentun", "optimizer.params.momentum"));
    ZT_CHECK(!zt_is_near_word("llama", "optimizer"));

    const char *const names[] = {"zero1", "zero2", "zero3"};
    ZT_CHECK(!strcmp(zt_nearest_word("zero4", names, 3), "zero1")); /* a tie: the first one */
    ZT_CHECK(!strcmp(zt_nearest_word("zer3", names, 3), "zero3"));
    ZT_CHECK(zt_nearest_word("tokenizer", names, 3) == NULL);
    ZT_CHECK(zt_nearest_word("x", names, 0) == NULL);
}

enum { O_HELP, O_SET, O_CONFIG, O_CHECK, N_O };
static const zt_cli_option options[N_O] = {
    [O_HELP] = {"--help", "-h", NULL, "help"},
    [O_SET] = {"--set", NULL, "KEY=VALUE", "set"},
    [O_CONFIG] = {"--config", NULL, "FILE", "config"},
    [O_CHECK] = {"--check", NULL, NULL, "check"},
};

static zt_status parse(int argc, const char **argv, zt_cli_arg **args, int *n, zt_error *err)
{
    return zt_cli_parse(options, N_O, argc, (char **)argv, args, n, err);
}

static void test_parse(void)
{
    zt_cli_arg *args;
    int n;
    zt_error err;
    const char *ok[] = {"zt-run", "--set", "a=1", "-h", "--config=run.json", "--set=b=2", "--check"};
    ZT_CHECK_INT(parse(7, ok, &args, &n, &err), ZT_OK);
    ZT_CHECK_INT(n, 5);
    if (n == 5) {
        ZT_CHECK_INT(args[0].option, O_SET);
        ZT_CHECK(!strcmp(args[0].value, "a=1"));
        ZT_CHECK_INT(args[1].option, O_HELP);
        ZT_CHECK(args[1].value == NULL);
        ZT_CHECK_INT(args[2].option, O_CONFIG);
        ZT_CHECK(!strcmp(args[2].value, "run.json"));
        ZT_CHECK_INT(args[3].option, O_SET);
        ZT_CHECK(!strcmp(args[3].value, "b=2")); /* only the first '=' separates name and value */
        ZT_CHECK_INT(args[4].option, O_CHECK);
    }
    free(args);

    const char *empty[] = {"zt-run"};
    ZT_CHECK_INT(parse(1, empty, &args, &n, &err), ZT_OK);
    ZT_CHECK_INT(n, 0);
    free(args);

    const char *typo[] = {"zt-run", "--chek"};
    ZT_CHECK_INT(parse(2, typo, &args, &n, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "unknown option '--chek'; did you mean '--check'?");
    const char *typo_with_value[] = {"zt-run", "--confg=run.json"};
    ZT_CHECK_INT(parse(2, typo_with_value, &args, &n, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "unknown option '--confg'; did you mean '--config'?");
    const char *missing[] = {"zt-run", "--check", "--config"};
    ZT_CHECK_INT(parse(3, missing, &args, &n, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "option --config needs a value: --config FILE");
    const char *flag_value[] = {"zt-run", "--help=yes"};
    ZT_CHECK_INT(parse(2, flag_value, &args, &n, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "option --help takes no value (got '--help=yes')");
    const char *positional[] = {"zt-run", "run.json"};
    ZT_CHECK_INT(parse(2, positional, &args, &n, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "unexpected argument 'run.json'");
    const char *dash[] = {"zt-run", "-"};
    ZT_CHECK_INT(parse(2, dash, &args, &n, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "unexpected argument '-'");
}

int main(void)
{
    test_edit_distance();
    test_near_words();
    test_parse();
    return zt_test_result();
}
