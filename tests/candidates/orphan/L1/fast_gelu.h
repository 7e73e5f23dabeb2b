// Test candidate with no baseline twin: the build must refuse it.
#pragma once
