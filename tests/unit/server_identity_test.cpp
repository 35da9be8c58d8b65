// Whether a server found after a loss is another one (sweeper/recovery.hpp, is_new_server),
// at both ends: an address can outlive its server.
#include <gtest/gtest.h>

#include "sweeper/recovery.hpp"

using namespace qsw;

TEST(ServerIdentity, TheFirstIdentificationIsNoChange) {
    EXPECT_FALSE(is_new_server({"", ""}, {"10.0.0.1:5432", "7715/00000001"}));
    EXPECT_FALSE(is_new_server({"", ""}, {"10.0.0.1:5432", ""}));
}

TEST(ServerIdentity, ARestartAtTheSameAddressIsTheSameServer) {
    EXPECT_FALSE(is_new_server({"10.0.0.1:5432", "7715/00000001"}, {"10.0.0.1:5432", "7715/00000001"}));
}

TEST(ServerIdentity, AnotherAddressIsAnotherServer) {
    EXPECT_TRUE(is_new_server({"10.0.0.1:5432", "7715/00000001"}, {"10.0.0.2:5432", "7715/00000001"}));
    EXPECT_TRUE(is_new_server({"10.0.0.1:5432", ""}, {"10.0.0.1:5433", ""}));
}

TEST(ServerIdentity, TheSameAddressWithAnotherIdentityIsAnotherServer) {
    // A standby promoted behind a floating address: the same system, the next timeline.
    EXPECT_TRUE(is_new_server({"10.0.0.1:5432", "7715/00000001"}, {"10.0.0.1:5432", "7715/00000002"}));
    // A restored copy or another cluster at the address: another system.
    EXPECT_TRUE(is_new_server({"local:5432", "7715/00000001"}, {"local:5432", "9001/00000001"}));
    // A standby that was promoted while the sweeper talked to it.
    EXPECT_TRUE(is_new_server({"10.0.0.1:5432", "7715/recovery"}, {"10.0.0.1:5432", "7715/00000002"}));
}

TEST(ServerIdentity, AnIdentityOneSideCouldNotReadDecidesNothing) {
    EXPECT_FALSE(is_new_server({"10.0.0.1:5432", ""}, {"10.0.0.1:5432", "7715/00000002"}));
    EXPECT_FALSE(is_new_server({"10.0.0.1:5432", "7715/00000001"}, {"10.0.0.1:5432", ""}));
}
