/* Input for bindgen (regen.sh): the CUPTI activity + callback API, nothing else. */
#include <cupti.h>
