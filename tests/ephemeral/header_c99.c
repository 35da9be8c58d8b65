/* queen_ephemeral.h compiles on its own as C99 with -pedantic -Werror. */
#include "queen_ephemeral.h"

int queen_ephemeral_headertest(void);
int queen_ephemeral_headertest(void) {
    queen_ephemeral_config cfg;
    queen_ephemeral_config_init(&cfg);
    return (int)cfg.struct_size > 0 ? QUEEN_EPHEMERAL_OK : QUEEN_EPHEMERAL_EINVAL;
}
