// placeholder: filled in by the foundation work
#include "tools.h"
namespace dscpp::tools {
int launch_main(int, char**) { return 1; }
}  // namespace dscpp::tools
