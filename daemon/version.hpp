#pragma once
namespace smddp { inline constexpr const char* kVersion = "0.1.0"; }
namespace smddp::daemon { using smddp::kVersion; }
