#include <gtest/gtest.h>

#include "pg/classify.hpp"

using namespace qsw;

TEST(Classify, NoSqlstateIsTransient) {
    EXPECT_EQ(classify_sqlstate(""), ErrorClass::transient);
    EXPECT_EQ(classify_sqlstate("123"), ErrorClass::transient);
}

TEST(Classify, SerializationAndDeadlockAreTransient) {
    EXPECT_EQ(classify_sqlstate("40001"), ErrorClass::transient);
    EXPECT_EQ(classify_sqlstate("40P01"), ErrorClass::transient);
    EXPECT_EQ(classify_sqlstate("40002"), ErrorClass::permanent);  // integrity violation at commit
}

TEST(Classify, ConnectionResourceOperatorAndSystemClassesAreTransient) {
    for (auto s : {"08000", "08006", "08001", "08P01", "53000", "53100", "53200", "53300", "57014", "57P01", "57P02",
                   "57P03", "58000", "58030"})
        EXPECT_EQ(classify_sqlstate(s), ErrorClass::transient) << s;
}

TEST(Classify, Class42IsConfig) {
    for (auto s : {"42883", "42501", "42P01", "42703", "42601", "42000"})
        EXPECT_EQ(classify_sqlstate(s), ErrorClass::config) << s;
}

TEST(Classify, EverythingElseIsPermanent) {
    for (auto s : {"22023", "23505", "23503", "P0001", "XX000", "25P02", "54000", "0A000", "22P02"})
        EXPECT_EQ(classify_sqlstate(s), ErrorClass::permanent) << s;
}

TEST(Classify, NamesAreStable) {
    EXPECT_STREQ(error_class_name(ErrorClass::transient), "transient");
    EXPECT_STREQ(error_class_name(ErrorClass::config), "config");
    EXPECT_STREQ(error_class_name(ErrorClass::permanent), "permanent");
}

TEST(Classify, TheSchemaAbsentIsNoFunctionNoSchemaOrNoTable) {
    for (auto s : {"42883", "3F000", "42P01"}) {
        PgResult r;
        r.sqlstate = s;
        EXPECT_TRUE(is_schema_absent(r)) << s;
    }
    for (auto s : {"42501", "42703", "", "08006", "22023"}) {
        PgResult r;
        r.sqlstate = s;
        EXPECT_FALSE(is_schema_absent(r)) << s;
    }
    PgResult answered;
    answered.ok = true;
    answered.sqlstate = "42883";
    EXPECT_FALSE(is_schema_absent(answered));
}
