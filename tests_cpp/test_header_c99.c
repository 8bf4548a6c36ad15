/* The public header compiles as strict C99 on its own, and its constants
 * agree with the library it links against. */
#include <concord/concord.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  concord_comm_options options = CONCORD_COMM_OPTIONS_INIT;
  concord_comm_t comm = NULL;
  if (options.struct_size != sizeof(concord_comm_options)) return 1;
  if (concord_version_code() != CONCORD_VERSION_CODE) return 2;
  if (CONCORD_OK != 0) return 3;
  if (strlen(concord_status_string(CONCORD_ERR_TIMEOUT)) == 0) return 4;
  if (concord_comm_destroy(comm) != CONCORD_OK) return 5;
  printf("concord %s, header C99 ok\n", concord_version());
  return 0;
}
